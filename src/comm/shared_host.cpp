// Shared host memory (torus/comm/shared_host.h): single allocations, the
// slab pool, and what happens to both across fork().
#include "torus/comm/shared_host.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/log.h"
#include "torus/core/error.h"
#include "torus/core/params.h"

namespace torus::comm {
namespace {

constexpr size_t kSlabAlign = size_t{2} << 20;

// One shared file mapped into this process: a single allocation, or a slab.
struct Region {
  uint32_t id;
  int fd;
  uint64_t inode;
  size_t bytes;
  bool slab = false;
  bool orphaned = false;  // in a fork() child: private now, never offered to peers
  size_t used = 0;        // slab: bytes in live blocks
};

struct FreeBlock {
  size_t bytes;
  uintptr_t slab;
  size_t cached;  // bytes that may still hold pages (an upper bound)
};

struct LiveBlock {
  size_t bytes;
  uintptr_t slab;
};

// Note [Shared host registry]: one mutex guards the regions, the pool's
// block maps and the counters. Every system call the pool makes under it is
// short (mmap, fallocate); fork() takes it (prepare handler) so that the
// child sees a consistent registry.
struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Region> by_base;  // start address -> region
  uint32_t next_id = 1;

  SharedHostPoolOptions pool;
  std::map<uintptr_t, FreeBlock> free_by_addr;
  std::set<std::pair<size_t, uintptr_t>> free_by_size;
  std::unordered_map<uintptr_t, LiveBlock> live;
  size_t cached = 0;   // sum of FreeBlock::cached
  size_t slabs = 0;
  size_t slab_bytes = 0;
  size_t live_bytes = 0;
  uint64_t allocs = 0;
  uint64_t slabs_made = 0;
  uint64_t punches = 0;
};

// Every slab ever made lies in [g_pool_lo, g_pool_hi) (the range only
// grows): frees of other memory, most of a program's CPU tensors, return at
// once without the mutex.
std::atomic<uintptr_t> g_pool_lo{UINTPTR_MAX};
std::atomic<uintptr_t> g_pool_hi{0};

void fork_prepare();
void fork_parent();
void fork_child();

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: frees may run during static destruction
    // The fork mode applies to single allocations too, which may come before
    // any pool options are set.
    reg->pool.fork_copy = env_params().shared_host.fork_copy;
    ::pthread_atfork(&fork_prepare, &fork_parent, &fork_child);
    return reg;
  }();
  return *r;
}

// "copy" mode: the parent waits at the fork until the child has copied
// (or died), so that nothing the parent writes after fork() returns gets
// into the child's snapshot. The child's end is written once copying is
// done; the parent reads end-of-file if the child is gone or fork failed.
int g_copied_pipe[2] = {-1, -1};

void fork_prepare() {
  Registry& r = registry();
  r.mu.lock();
  if (r.pool.fork_copy && !r.by_base.empty() && ::pipe2(g_copied_pipe, O_CLOEXEC) != 0) {
    g_copied_pipe[0] = g_copied_pipe[1] = -1;  // the child copies without the parent waiting
  }
}

void fork_parent() {
  if (g_copied_pipe[0] >= 0) {
    ::close(g_copied_pipe[1]);
    char byte;
    while (::read(g_copied_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    ::close(g_copied_pipe[0]);
    g_copied_pipe[0] = g_copied_pipe[1] = -1;
  }
  registry().mu.unlock();
}

// Note [Shared host memory across fork]: the child must not write into
// the parent's memory, so every region becomes private in the child, at the
// same address:
//  - "copy" (TORUS_SHARED_HOST_FORK=copy): the live bytes are copied into
//    anonymous memory that replaces the region: an exact snapshot, paid for
//    with a copy of every live block in every child, during which the
//    parent waits in fork();
//  - "view" (the default): the region is mapped copy-on-write from its
//    file: free, and the child's writes stay its own, but a page the child
//    has not written shows what the parent writes there later (or zeros,
//    once the parent frees the block and the pool gives the page back).
// Where the kernel refuses both, the region is made inaccessible, so the
// child faults instead of reaching the parent's memory. The child stops
// offering the regions (its pid is not the one peers know) and forgets the
// pool's free blocks; its inherited live blocks stay mapped until it exits.
bool make_private_copy(Registry& r, uintptr_t base, const Region& g) {
  void* tmp = ::mmap(nullptr, g.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (tmp == MAP_FAILED) return false;
  char* dst = static_cast<char*>(tmp);
  const char* src = reinterpret_cast<const char*>(base);
  if (g.slab) {
    for (const auto& [a, blk] : r.live) {
      if (blk.slab == base) std::memcpy(dst + (a - base), src + (a - base), blk.bytes);
    }
  } else {
    std::memcpy(dst, src, g.bytes);
  }
  if (::mremap(tmp, g.bytes, g.bytes, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(base)) == MAP_FAILED) {
    ::munmap(tmp, g.bytes);
    return false;
  }
  return true;
}

void fork_child() {
  Registry& r = registry();
  for (auto& [base, g] : r.by_base) {
    if (g.orphaned) continue;
    void* at = reinterpret_cast<void*>(base);
    bool done = r.pool.fork_copy && make_private_copy(r, base, g);
    if (!done) {
      done = ::mmap(at, g.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, g.fd, 0) != MAP_FAILED;
    }
    if (!done && ::mprotect(at, g.bytes, PROT_NONE) != 0) {
      ::mmap(at, g.bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
    ::close(g.fd);
    g.fd = -1;
    g.orphaned = true;
  }
  r.free_by_addr.clear();
  r.free_by_size.clear();
  r.cached = 0;
  r.slabs = 0;
  r.slab_bytes = 0;
  if (g_copied_pipe[0] >= 0) {
    ::close(g_copied_pipe[0]);
    (void)!::write(g_copied_pipe[1], "c", 1);
    ::close(g_copied_pipe[1]);
    g_copied_pipe[0] = g_copied_pipe[1] = -1;
  }
  r.mu.unlock();
}

size_t page_size() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A new shared file of `rounded` bytes mapped here; the caller registers it.
struct NewFile {
  void* p;
  int fd;
  uint64_t inode;
};
NewFile map_new_file(size_t rounded, const char* what, size_t requested) {
  int fd = ::memfd_create("torus-shared-host", MFD_CLOEXEC);
  TORUS_CHECK(fd >= 0, CommError, "{}({}): memfd_create failed: {}", what, requested, std::strerror(errno));
  auto fail = [&](const char* call) {
    const int err = errno;
    ::close(fd);
    return CommError(fmt::format("{}({}): {} failed: {}", what, requested, call, std::strerror(err)));
  };
  if (::ftruncate(fd, static_cast<off_t>(rounded)) != 0) throw fail("ftruncate");
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw fail("fstat");
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw fail("mmap");
  return {p, fd, static_cast<uint64_t>(st.st_ino)};
}

uint32_t take_id(Registry& r) {
  const uint32_t id = r.next_id++;
  if (r.next_id == 0) r.next_id = 1;  // 0 means "not shared" to the peers
  return id;
}

// --- the pool's free lists (caller holds the mutex) ---------------------------

void insert_free(Registry& r, uintptr_t a, const FreeBlock& b) {
  r.free_by_addr.emplace(a, b);
  r.free_by_size.emplace(b.bytes, a);
  r.cached += b.cached;
}

FreeBlock erase_free(Registry& r, std::map<uintptr_t, FreeBlock>::iterator it) {
  FreeBlock b = it->second;
  r.free_by_size.erase({b.bytes, it->first});
  r.cached -= b.cached;
  r.free_by_addr.erase(it);
  return b;
}

// Slabs given back by trim_cache, unmapped and closed once the mutex is
// released.
struct Released {
  uintptr_t base;
  size_t bytes;
  int fd;
};

// Gives memory back until at most half of the cache budget is kept: first
// whole slabs with no live block, then the pages of free blocks, lowest
// address first.
void trim_cache(Registry& r, std::vector<Released>& released) {
  const size_t keep = r.pool.cache_bytes / 2;
  for (auto it = r.by_base.begin(); it != r.by_base.end() && r.cached > keep;) {
    Region& g = it->second;
    if (!g.slab || g.orphaned || g.used != 0) {
      ++it;
      continue;
    }
    erase_free(r, r.free_by_addr.find(it->first));  // the slab is one free block
    released.push_back({it->first, g.bytes, g.fd});
    --r.slabs;
    r.slab_bytes -= g.bytes;
    it = r.by_base.erase(it);
  }
  for (auto it = r.free_by_addr.begin(); it != r.free_by_addr.end() && r.cached > keep; ++it) {
    FreeBlock& b = it->second;
    if (b.cached == 0) continue;
    const Region& g = r.by_base.at(b.slab);
    const off_t off = static_cast<off_t>(it->first - b.slab);
    if (::fallocate(g.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, static_cast<off_t>(b.bytes)) != 0) {
      TORUS_LOG_DEBUG("shared host pool: giving back {} bytes failed: {}", b.bytes, std::strerror(errno));
      continue;
    }
    r.cached -= b.cached;
    b.cached = 0;
    ++r.punches;
  }
}

void release_slabs(const std::vector<Released>& released) {
  for (const Released& s : released) {
    // Peers may keep the file mapped for a while: free its pages now.
    ::fallocate(s.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(s.bytes));
    ::munmap(reinterpret_cast<void*>(s.base), s.bytes);
    ::close(s.fd);
  }
}

}  // namespace

// --- single allocations -----------------------------------------------------------

void* shared_host_alloc(size_t bytes) {
  TORUS_CHECK(bytes > 0, InvalidArgument, "shared_host_alloc: bytes must be > 0");
  const size_t rounded = round_up(bytes, page_size());
  NewFile f = map_new_file(rounded, "shared_host_alloc", bytes);
  try {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.by_base.emplace(reinterpret_cast<uintptr_t>(f.p), Region{take_id(r), f.fd, f.inode, rounded});
  } catch (...) {
    ::munmap(f.p, rounded);
    ::close(f.fd);
    throw;
  }
  return f.p;
}

void shared_host_free(void* p) {
  if (p == nullptr) return;
  Region region{};
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_base.find(reinterpret_cast<uintptr_t>(p));
    TORUS_CHECK(it != r.by_base.end() && !it->second.slab, InvalidArgument,
                "shared_host_free: {} is not the start of memory from shared_host_alloc", p);
    region = it->second;
    r.by_base.erase(it);
  }
  ::munmap(p, region.bytes);
  if (region.fd >= 0) ::close(region.fd);
}

std::optional<SharedHostSpan> find_shared_host(const void* p, size_t bytes) {
  if (p == nullptr) return std::nullopt;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_base.upper_bound(a);
  if (it == r.by_base.begin()) return std::nullopt;
  --it;
  const size_t off = a - it->first;
  const Region& g = it->second;
  if (g.orphaned || off >= g.bytes || bytes > g.bytes - off) return std::nullopt;
  return SharedHostSpan{g.id, g.fd, g.inode, off, g.bytes};
}

// --- the pool ---------------------------------------------------------------------

SharedHostPoolOptions SharedHostPoolOptions::from_params(const EnvParams& params) {
  const EnvParams::SharedHost& e = params.shared_host;
  SharedHostPoolOptions o;
  o.slab_bytes = e.slab_bytes.value_or(o.slab_bytes);  // params.cpp checks >= kSlabAlign
  o.cache_bytes = e.cache_bytes.value_or(o.cache_bytes);
  o.fork_copy = e.fork_copy;
  return o;
}

SharedHostPoolOptions SharedHostPoolOptions::from_env() { return from_params(env_params()); }

void set_shared_host_pool_options(const SharedHostPoolOptions& options) {
  TORUS_CHECK(options.slab_bytes >= kSlabAlign, InvalidArgument, "shared host pool: slab_bytes {} must be >= {}",
              options.slab_bytes, kSlabAlign);
  Registry& r = registry();
  std::vector<Released> released;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.pool = options;
    r.pool.slab_bytes = round_up(options.slab_bytes, kSlabAlign);
    if (r.cached > r.pool.cache_bytes) trim_cache(r, released);
  }
  release_slabs(released);
}

void* shared_host_pool_alloc(size_t bytes) {
  TORUS_CHECK(bytes > 0, InvalidArgument, "shared_host_pool_alloc: bytes must be > 0");
  TORUS_CHECK(bytes <= (size_t{1} << 62), InvalidArgument, "shared_host_pool_alloc: {} bytes is too large", bytes);
  const size_t n = round_up(bytes, page_size());
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto fit = r.free_by_size.lower_bound({n, 0});
  if (fit == r.free_by_size.end()) {
    const size_t slab = std::max(r.pool.slab_bytes, round_up(n, kSlabAlign));
    NewFile f = map_new_file(slab, "shared_host_pool_alloc", bytes);
    const uintptr_t base = reinterpret_cast<uintptr_t>(f.p);
    try {
      Region g{take_id(r), f.fd, f.inode, slab};
      g.slab = true;
      r.by_base.emplace(base, g);
      insert_free(r, base, FreeBlock{slab, base, 0});
    } catch (...) {
      r.by_base.erase(base);
      ::munmap(f.p, slab);
      ::close(f.fd);
      throw;
    }
    ++r.slabs;
    ++r.slabs_made;
    r.slab_bytes += slab;
    if (base < g_pool_lo.load(std::memory_order_relaxed)) g_pool_lo.store(base, std::memory_order_release);
    if (base + slab > g_pool_hi.load(std::memory_order_relaxed)) g_pool_hi.store(base + slab, std::memory_order_release);
    fit = r.free_by_size.lower_bound({n, 0});
  }
  const uintptr_t a = fit->second;
  FreeBlock b = erase_free(r, r.free_by_addr.find(a));
  if (b.bytes > n) {
    // Which of the block's pages are resident is not known: the rest keeps
    // as many as it can hold, so `cached` stays an upper bound.
    insert_free(r, a + n, FreeBlock{b.bytes - n, b.slab, std::min(b.cached, b.bytes - n)});
  }
  r.live.emplace(a, LiveBlock{n, b.slab});
  r.by_base.at(b.slab).used += n;
  r.live_bytes += n;
  ++r.allocs;
  return reinterpret_cast<void*>(a);
}

bool shared_host_pool_free(void* p) noexcept {
  if (p == nullptr) return false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  // A block being freed was handed out after its slab's range was stored
  // (under the mutex), so this thread sees that range.
  if (a < g_pool_lo.load(std::memory_order_acquire) || a >= g_pool_hi.load(std::memory_order_acquire)) return false;
  Registry& r = registry();
  std::vector<Released> released;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto lit = r.live.find(a);
    if (lit == r.live.end()) return false;
    const LiveBlock blk = lit->second;
    r.live.erase(lit);
    Region& g = r.by_base.at(blk.slab);
    if (g.orphaned) return true;  // a fork() child's copy: kept until exit
    g.used -= blk.bytes;
    r.live_bytes -= blk.bytes;

    FreeBlock merged{blk.bytes, blk.slab, blk.bytes};
    uintptr_t start = a;
    auto next = r.free_by_addr.find(a + blk.bytes);
    if (next != r.free_by_addr.end() && next->second.slab == blk.slab) {
      FreeBlock nb = erase_free(r, next);
      merged.bytes += nb.bytes;
      merged.cached += nb.cached;
    }
    auto prev = r.free_by_addr.lower_bound(a);
    if (prev != r.free_by_addr.begin()) {
      --prev;
      if (prev->second.slab == blk.slab && prev->first + prev->second.bytes == a) {
        start = prev->first;
        FreeBlock pb = erase_free(r, prev);
        merged.bytes += pb.bytes;
        merged.cached += pb.cached;
      }
    }
    insert_free(r, start, merged);
    // A wholly free slab stays (the next step's tensors reuse its pages)
    // until the cache is over budget.
    if (r.cached > r.pool.cache_bytes) trim_cache(r, released);
  }
  release_slabs(released);
  return true;
}

SharedHostPoolStats shared_host_pool_stats() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  SharedHostPoolStats s;
  s.slabs = r.slabs;
  s.slab_bytes = r.slab_bytes;
  s.live_blocks = r.live.size();
  s.live_bytes = r.live_bytes;
  for (const auto& [a, b] : r.free_by_addr) s.free_bytes += b.bytes;
  s.free_blocks = r.free_by_addr.size();
  s.cached_bytes = r.cached;
  s.allocs = r.allocs;
  s.slabs_made = r.slabs_made;
  s.punches = r.punches;
  return s;
}

// --- the allocator's policy (the allocator itself is in the tensor layer) ---------

SharedHostAllocatorOptions SharedHostAllocatorOptions::from_params(const EnvParams& params) {
  SharedHostAllocatorOptions o;
  o.min_bytes = params.shared_host.alloc_min_bytes.value_or(o.min_bytes);
  o.pool = SharedHostPoolOptions::from_params(params);
  return o;
}

SharedHostAllocatorOptions SharedHostAllocatorOptions::from_env() { return from_params(env_params()); }

}  // namespace torus::comm
