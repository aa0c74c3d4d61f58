// Shared host memory (torus/comm/shared_host.h).
#include "torus/comm/shared_host.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "core/log.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

struct Region {
  uint32_t id;
  int fd;
  uint64_t inode;
  size_t bytes;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Region> by_base;  // start address -> region
  uint32_t next_id = 1;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: frees may run during static destruction
  return *r;
}

}  // namespace

void* shared_host_alloc(size_t bytes) {
  TORUS_CHECK(bytes > 0, InvalidArgument, "shared_host_alloc: bytes must be > 0");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t rounded = (bytes + page - 1) / page * page;
  int fd = ::memfd_create("torus-shared-host", MFD_CLOEXEC);
  TORUS_CHECK(fd >= 0, CommError, "shared_host_alloc({}): memfd_create failed: {}", bytes, std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(rounded)) != 0) {
    const int err = errno;
    ::close(fd);
    throw CommError(fmt::format("shared_host_alloc({}): ftruncate failed: {}", bytes, std::strerror(err)));
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw CommError(fmt::format("shared_host_alloc({}): fstat failed: {}", bytes, std::strerror(err)));
  }
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    throw CommError(fmt::format("shared_host_alloc({}): mmap failed: {}", bytes, std::strerror(err)));
  }
  try {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    const uint32_t id = r.next_id++;
    if (r.next_id == 0) r.next_id = 1;  // 0 means "not shared" to the peers
    r.by_base.emplace(reinterpret_cast<uintptr_t>(p), Region{id, fd, static_cast<uint64_t>(st.st_ino), rounded});
  } catch (...) {
    ::munmap(p, rounded);
    ::close(fd);
    throw;
  }
  return p;
}

void shared_host_free(void* p) {
  if (p == nullptr) return;
  Region region{};
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_base.find(reinterpret_cast<uintptr_t>(p));
    TORUS_CHECK(it != r.by_base.end(), InvalidArgument,
                "shared_host_free: {} is not the start of memory from shared_host_alloc", p);
    region = it->second;
    r.by_base.erase(it);
  }
  ::munmap(p, region.bytes);
  ::close(region.fd);
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
  if (off >= g.bytes || bytes > g.bytes - off) return std::nullopt;
  return SharedHostSpan{g.id, g.fd, g.inode, off, g.bytes};
}

}  // namespace torus::comm
