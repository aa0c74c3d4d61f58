// Shared host buffers (torus/comm/shared_host.h) and the zero-copy host
// path they enable (Note [Zero-copy host ops] in host_collectives.h): the
// allocator's bookkeeping; a group's mappings of its peers' regions; all_reduce, reduce_scatter, all_gather,
// broadcast and all_to_all on 2-4 ranks against closed forms, for every dtype kind, in and
// out of place, with aligned and unaligned buffers, with cached and
// non-temporal stores; ranks mixing shared and ordinary buffers fall back to the stripes
// with the same results; more regions than a group keeps mapped; a dead
// peer is named.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "collective_checks.h"
#include "comm/ofi/host_collectives.h"
#include "comm/ofi/peer_mappings.h"
#include "torus/comm/shared_host.h"
#include "torus/core/error.h"

namespace torus::comm::ofi::test {
namespace {

using Ms = std::chrono::milliseconds;

// `n` elements of T in shared host memory, `skew` bytes past the start of
// their allocation (a skew that is not a multiple of 64 takes the path for
// unaligned outputs).
// Where SharedVec takes its memory: single allocations (shared_host_alloc)
// or blocks of the slab pool (shared_host_pool_alloc).
bool g_pool_buffers = false;

template <typename T>
class SharedVec {
 public:
  SharedVec(size_t n, size_t skew = 0) : n_(n), pool_(g_pool_buffers) {
    const size_t bytes = n * sizeof(T) + skew + 64;
    base_ = pool_ ? shared_host_pool_alloc(bytes) : shared_host_alloc(bytes);
    p_ = reinterpret_cast<T*>(static_cast<char*>(base_) + skew);
  }
  ~SharedVec() {
    if (pool_) {
      shared_host_pool_free(base_);
    } else {
      shared_host_free(base_);
    }
  }
  SharedVec(const SharedVec&) = delete;
  SharedVec& operator=(const SharedVec&) = delete;
  T* data() { return p_; }
  T& operator[](size_t i) { return p_[i]; }
  size_t size() const { return n_; }
  std::vector<T> vec() const { return std::vector<T>(p_, p_ + n_); }

 private:
  size_t n_;
  bool pool_;
  void* base_;
  T* p_;
};

TEST(SharedHost, AllocationsAreFoundAndFreed) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  char* p = static_cast<char*>(shared_host_alloc(10000));
  ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % page, 0u);
  for (size_t i = 0; i < 10000; ++i) ASSERT_EQ(p[i], 0) << "not zeroed at " << i;
  auto span = find_shared_host(p + 100, 50);
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(span->offset, 100u);
  EXPECT_EQ(span->region_bytes % page, 0u);
  EXPECT_GE(span->region_bytes, 10000u);
  EXPECT_GE(span->fd, 0);
  EXPECT_TRUE(is_shared_host(p, span->region_bytes));
  EXPECT_FALSE(is_shared_host(p, span->region_bytes + 1)) << "a span past the end";
  EXPECT_FALSE(is_shared_host(p + span->region_bytes, 1)) << "the byte after the region";
  std::vector<char> heap(64);
  EXPECT_FALSE(is_shared_host(heap.data(), heap.size()));
  EXPECT_FALSE(is_shared_host(nullptr, 1));

  char* q = static_cast<char*>(shared_host_alloc(1));
  auto span_q = find_shared_host(q, 1);
  ASSERT_TRUE(span_q.has_value());
  EXPECT_NE(span_q->id, span->id);
  EXPECT_THROW(shared_host_free(p + 1), InvalidArgument);
  EXPECT_THROW(shared_host_alloc(0), InvalidArgument);
  shared_host_free(nullptr);
  shared_host_free(p);
  EXPECT_FALSE(is_shared_host(p, 1)) << "a freed region is still registered";
  EXPECT_THROW(shared_host_free(p), InvalidArgument) << "double free not caught";
  // Ids are never reused, even where the address is.
  char* r = static_cast<char*>(shared_host_alloc(10000));
  auto span_r = find_shared_host(r, 1);
  ASSERT_TRUE(span_r.has_value());
  EXPECT_GT(span_r->id, span_q->id);
  shared_host_free(r);
  shared_host_free(q);
}

// Sets the pool's options for a test, after returning the wholly free
// slabs earlier tests left (a cache of 0), and restores the defaults.
struct PoolOptionsScope {
  explicit PoolOptionsScope(const SharedHostPoolOptions& o) {
    SharedHostPoolOptions flush = o;
    flush.cache_bytes = 0;
    set_shared_host_pool_options(flush);
    set_shared_host_pool_options(o);
  }
  ~PoolOptionsScope() { set_shared_host_pool_options(SharedHostPoolOptions{}); }
};

size_t page_bytes() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

// Blocks of the pool: page aligned and rounded, disjoint, found inside
// their slab at the right offset; a request larger than a slab gets a slab
// of its own, kept for reuse while the cache allows and returned past it;
// freed neighbours coalesce, so the slab is one free block again; pointers
// from elsewhere are refused.
TEST(SharedHostPool, BlocksAreDisjointFoundAndCoalesced) {
  PoolOptionsScope scope({size_t{4} << 20, size_t{64} << 20});
  const size_t page = page_bytes();
  const SharedHostPoolStats s0 = shared_host_pool_stats();
  const std::vector<size_t> sizes = {1, page, page + 1, 5000, size_t{1} << 20, (size_t{3} << 20) - 7};
  std::vector<char*> blocks;
  size_t rounded_total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    char* p = static_cast<char*>(shared_host_pool_alloc(sizes[i]));
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % page, 0u) << "block " << i << " not page aligned";
    std::memset(p, static_cast<int>(i + 1), sizes[i]);
    auto span = find_shared_host(p, sizes[i]);
    ASSERT_TRUE(span.has_value()) << "block " << i << " not found";
    EXPECT_GE(span->region_bytes, size_t{4} << 20) << "a block outside a slab";
    EXPECT_LE(span->offset + sizes[i], span->region_bytes);
    // The span's base is the slab: its start plus the offset is the block.
    auto base = find_shared_host(p - span->offset, 1);
    ASSERT_TRUE(base.has_value());
    EXPECT_EQ(base->id, span->id);
    EXPECT_EQ(base->offset, 0u);
    blocks.push_back(p);
    rounded_total += (sizes[i] + page - 1) / page * page;
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t k = 0; k < sizes[i]; k += 997) ASSERT_EQ(blocks[i][k], static_cast<char>(i + 1)) << "overlap at block " << i;
  }
  SharedHostPoolStats s1 = shared_host_pool_stats();
  EXPECT_EQ(s1.live_blocks - s0.live_blocks, sizes.size());
  EXPECT_EQ(s1.live_bytes - s0.live_bytes, rounded_total);
  EXPECT_EQ(s1.allocs - s0.allocs, sizes.size());
  EXPECT_EQ(s1.slab_bytes, s1.live_bytes + s1.free_bytes);

  // Larger than a slab: a slab of its own, given back when freed.
  char* big = static_cast<char*>(shared_host_pool_alloc((size_t{9} << 20) + 1));
  auto big_span = find_shared_host(big, size_t{9} << 20);
  ASSERT_TRUE(big_span.has_value());
  EXPECT_EQ(big_span->offset, 0u);
  EXPECT_GE(big_span->region_bytes, (size_t{9} << 20) + 1);
  const SharedHostPoolStats s2 = shared_host_pool_stats();
  EXPECT_EQ(s2.slabs, s1.slabs + 1);
  std::memset(big, 7, size_t{9} << 20);
  EXPECT_TRUE(shared_host_pool_free(big));
  EXPECT_EQ(shared_host_pool_stats().slabs, s2.slabs) << "a wholly free slab within the cache was returned";
  char* again = static_cast<char*>(shared_host_pool_alloc(size_t{9} << 20));
  EXPECT_EQ(again, big) << "the kept slab was not reused";
  EXPECT_EQ(shared_host_pool_stats().slabs_made, s2.slabs_made);
  EXPECT_TRUE(shared_host_pool_free(again));
  set_shared_host_pool_options({size_t{4} << 20, 0});  // over budget: wholly free slabs go
  EXPECT_EQ(shared_host_pool_stats().slabs, s1.slabs) << "a wholly free slab past the cache was kept";
  EXPECT_FALSE(is_shared_host(big, 1)) << "a returned slab is still registered";
  set_shared_host_pool_options({size_t{4} << 20, size_t{64} << 20});

  // Not pool blocks: refused without harm.
  std::vector<char> heap(64);
  EXPECT_FALSE(shared_host_pool_free(heap.data()));
  EXPECT_FALSE(shared_host_pool_free(nullptr));
  EXPECT_FALSE(shared_host_pool_free(blocks[2] + 1)) << "an interior pointer was freed";
  EXPECT_THROW(shared_host_free(blocks[0] - find_shared_host(blocks[0], 1)->offset), InvalidArgument)
      << "shared_host_free accepted a slab";
  EXPECT_THROW(shared_host_pool_alloc(0), InvalidArgument);

  // Free in an order that needs merging on both sides.
  for (size_t i : {1, 3, 0, 2, 5, 4}) {
    EXPECT_TRUE(shared_host_pool_free(blocks[i]));
  }
  EXPECT_FALSE(shared_host_pool_free(blocks[0])) << "double free not refused";
  const SharedHostPoolStats s3 = shared_host_pool_stats();
  EXPECT_EQ(s3.live_blocks, s0.live_blocks);
  EXPECT_EQ(s3.live_bytes, s0.live_bytes);
  EXPECT_EQ(s3.slabs, s1.slabs);
  EXPECT_EQ(s3.free_bytes, s3.slab_bytes);
  if (s0.live_blocks == 0) EXPECT_EQ(s3.free_blocks, s3.slabs) << "free neighbours did not merge";
  // One block the size of a whole slab fits again without a new slab.
  if (s0.live_blocks == 0) {
    void* whole = shared_host_pool_alloc(size_t{4} << 20);
    EXPECT_EQ(shared_host_pool_stats().slabs_made, s3.slabs_made) << "the merged slab was not reused whole";
    shared_host_pool_free(whole);
  }
}

// Freed blocks keep their pages while the cache allows (a reused block
// still holds what was written), and give them back beyond it (a reused
// block reads zeros: the pages were returned).
TEST(SharedHostPool, FreedPagesAreKeptUpToTheCacheThenGivenBack) {
  const size_t two = size_t{2} << 20;
  {
    PoolOptionsScope scope({size_t{8} << 20, size_t{64} << 20});
    char* a = static_cast<char*>(shared_host_pool_alloc(two));
    std::memset(a, 0xAB, two);
    const uint64_t punches = shared_host_pool_stats().punches;
    ASSERT_TRUE(shared_host_pool_free(a));
    EXPECT_GE(shared_host_pool_stats().cached_bytes, two);
    char* b = static_cast<char*>(shared_host_pool_alloc(two));
    ASSERT_EQ(b, a) << "best fit did not reuse the freed block";
    EXPECT_EQ(static_cast<unsigned char>(b[0]), 0xABu);
    EXPECT_EQ(static_cast<unsigned char>(b[two - 1]), 0xABu) << "a cached block lost its pages";
    EXPECT_EQ(shared_host_pool_stats().punches, punches);
    shared_host_pool_free(b);
  }
  {
    PoolOptionsScope scope({size_t{8} << 20, size_t{1} << 20});
    void* keep_slab = shared_host_pool_alloc(4096);  // the slab is never wholly free: pages are punched
    char* a = static_cast<char*>(shared_host_pool_alloc(two));
    std::memset(a, 0xCD, two);
    const uint64_t punches = shared_host_pool_stats().punches;
    ASSERT_TRUE(shared_host_pool_free(a));
    const SharedHostPoolStats s = shared_host_pool_stats();
    EXPECT_GT(s.punches, punches) << "nothing given back past the cache";
    EXPECT_LE(s.cached_bytes, size_t{512} << 10);
    char* b = static_cast<char*>(shared_host_pool_alloc(two));
    ASSERT_EQ(b, a);
    for (size_t k = 0; k < two; k += 4096) ASSERT_EQ(b[k], 0) << "a given-back page kept its data at " << k;
    shared_host_pool_free(b);
    shared_host_pool_free(keep_slab);
  }
  {
    // The count of kept bytes stays an upper bound when a block whose
    // resident pages are at its end is split: [A given back][B kept] merge,
    // a new block takes A's place, and B's pages are still counted.
    const size_t one = size_t{1} << 20;
    PoolOptionsScope scope({size_t{8} << 20, size_t{64} << 20});
    char* a = static_cast<char*>(shared_host_pool_alloc(one));
    char* b = static_cast<char*>(shared_host_pool_alloc(one));
    void* keep_slab = shared_host_pool_alloc(4096);
    ASSERT_EQ(b, a + one) << "blocks not carved in address order";
    std::memset(a, 1, one);
    std::memset(b, 2, one);
    shared_host_pool_free(a);
    set_shared_host_pool_options({size_t{8} << 20, one / 2});  // gives A's pages back
    set_shared_host_pool_options({size_t{8} << 20, size_t{64} << 20});
    ASSERT_EQ(shared_host_pool_stats().cached_bytes, 0u);
    shared_host_pool_free(b);
    EXPECT_EQ(shared_host_pool_stats().cached_bytes, one);
    char* c = static_cast<char*>(shared_host_pool_alloc(one));
    ASSERT_EQ(c, a);
    EXPECT_GE(shared_host_pool_stats().cached_bytes, one) << "B's resident pages are no longer counted";
    shared_host_pool_free(c);
    shared_host_pool_free(keep_slab);
  }
}

// What a fork() child saw, as bits of its exit code.
enum ForkSeen {
  kSawOldValues = 1,      // the memory as it was at the fork
  kStillOffered = 2,      // inherited memory still offered as shared
  kFreeFailed = 4,        // could not free an inherited block
  kOwnNotShared = 8,      // its own new pool memory is not shared
  kSawParentWrite = 16,   // a write the parent made after the fork
};

// Forks with a pooled block (1s) and a single allocation (3s). After the
// fork the parent writes 5s over the pooled block, frees the allocation,
// and lets the child look: the child checks what it sees, writes 2s and 4s
// (which must not reach the parent), frees both, and allocates its own.
int fork_and_look(bool copy) {
  const size_t n = size_t{1} << 20;
  SharedHostPoolOptions o;
  o.fork_copy = copy;
  PoolOptionsScope scope(o);
  char* pooled = static_cast<char*>(shared_host_pool_alloc(n));
  char* single = static_cast<char*>(shared_host_alloc(n));
  std::memset(pooled, 1, n);
  std::memset(single, 3, n);
  int go[2];
  if (::pipe(go) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::close(go[1]);
    char byte;
    if (::read(go[0], &byte, 1) != 1) ::_exit(100);
    int seen = 0;
    bool old = true, parent = false;
    for (size_t k = 0; k < n; k += 4093) {
      old = old && pooled[k] == 1 && single[k] == 3;
      parent = parent || pooled[k] == 5;
    }
    if (old) seen |= kSawOldValues;
    if (parent) seen |= kSawParentWrite;
    if (is_shared_host(pooled, n) || is_shared_host(single, n)) seen |= kStillOffered;
    std::memset(pooled, 2, n);
    std::memset(single, 4, n);
    if (!shared_host_pool_free(pooled)) seen |= kFreeFailed;
    shared_host_free(single);
    void* fresh = shared_host_pool_alloc(n);
    if (!is_shared_host(fresh, n)) seen |= kOwnNotShared;
    shared_host_pool_free(fresh);
    ::_exit(seen);
  }
  ::close(go[0]);
  std::memset(pooled, 5, n / 2);  // the first half only: the child's view may show it
  for (size_t k = 0; k < n; k += 4093) {
    if (single[k] != 3) return -2;  // the child has not run yet
  }
  (void)::write(go[1], "g", 1);
  ::close(go[1]);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -3;
  // The child's writes did not reach the parent.
  for (size_t k = 0; k < n; k += 4093) {
    if (pooled[k] != (k < n / 2 ? 5 : 1) || single[k] != 3) return -4;
  }
  if (!is_shared_host(pooled, n) || !is_shared_host(single, n)) return -5;
  shared_host_pool_free(pooled);
  shared_host_free(single);
  return WEXITSTATUS(status);
}

// "copy": the child sees exactly the memory of the fork, whatever the
// parent does after it; its writes stay its own; it offers none of the
// inherited memory, frees it without harm and allocates shared memory of
// its own.
TEST(SharedHostPool, ForkChildCopyIsASnapshot) {
  const int seen = fork_and_look(true);
  ASSERT_GE(seen, 0) << "the parent's side of the check failed (" << seen << "): the child wrote into its memory";
  EXPECT_TRUE(seen & kSawOldValues) << "the child did not see the memory as it was at the fork";
  EXPECT_FALSE(seen & kSawParentWrite) << "the parent's later write reached the child's copy";
  EXPECT_FALSE(seen & kStillOffered);
  EXPECT_FALSE(seen & kFreeFailed);
  EXPECT_FALSE(seen & kOwnNotShared);
}

// "view" (the default): the child's writes stay its own too; pages it has
// not written show the parent's later writes, as documented.
TEST(SharedHostPool, ForkChildViewIsPrivateToTheChild) {
  const int seen = fork_and_look(false);
  ASSERT_GE(seen, 0) << "the parent's side of the check failed (" << seen << "): the child wrote into its memory";
  EXPECT_TRUE(seen & kSawParentWrite) << "view mode is documented to show the parent's later writes";
  EXPECT_FALSE(seen & kStillOffered);
  EXPECT_FALSE(seen & kFreeFailed);
  EXPECT_FALSE(seen & kOwnNotShared);
}

// A group's view of its peers' regions, here of this process's own: the
// mapping aliases the allocation; another inode, a short file or a closed
// descriptor map nothing; the least recently used mapping goes first, but
// never one the current op uses.
TEST(SharedHost, PeerMappingsCheckTheFileAndEvict) {
  const int pid = static_cast<int>(::getpid());
  char* a = static_cast<char*>(shared_host_alloc(8192));
  char* b = static_cast<char*>(shared_host_alloc(8192));
  char* c = static_cast<char*>(shared_host_alloc(8192));
  auto sa = *find_shared_host(a, 1), sb = *find_shared_host(b, 1), sc = *find_shared_host(c, 1);
  PeerMappings maps(2);
  maps.begin_op();
  char* ma = maps.map(pid, sa.id, sa.fd, sa.inode, 8192);
  ASSERT_NE(ma, nullptr);
  ASSERT_NE(ma, a) << "expected a second mapping of the same memory";
  a[100] = 42;
  EXPECT_EQ(ma[100], 42) << "the mapping does not alias the allocation";
  ma[200] = 7;
  EXPECT_EQ(a[200], 7);
  EXPECT_EQ(maps.map(pid, sa.id, sa.fd, sa.inode, 4096), ma) << "not served from the cache";
  EXPECT_EQ(maps.map(pid, sb.id, sb.fd, sa.inode, 4096), nullptr) << "another file's inode was accepted";
  EXPECT_EQ(maps.map(pid, sb.id, sb.fd, sb.inode, 1 << 20), nullptr) << "a file too short was accepted";
  EXPECT_EQ(maps.map(pid, 99999, 1 << 20, sb.inode, 1), nullptr) << "a closed descriptor was mapped";
  maps.begin_op();
  ASSERT_NE(maps.map(pid, sb.id, sb.fd, sb.inode, 8192), nullptr);
  EXPECT_EQ(maps.size(), 2u);
  maps.begin_op();
  ASSERT_NE(maps.map(pid, sa.id, sa.fd, sa.inode, 8192), nullptr);  // a is now the most recent
  maps.begin_op();
  ASSERT_NE(maps.map(pid, sc.id, sc.fd, sc.inode, 8192), nullptr);  // evicts b
  EXPECT_EQ(maps.size(), 2u);
  maps.begin_op();
  EXPECT_EQ(maps.map(pid, sa.id, sa.fd, sa.inode, 8192), ma) << "the most recently used mapping was evicted";
  // One op needing more regions than the cache keeps: nothing it mapped is
  // evicted while it runs (the cache grows), and its pointers stay valid.
  maps.begin_op();
  char* m1 = maps.map(pid, sa.id, sa.fd, sa.inode, 8192);
  char* m2 = maps.map(pid, sb.id, sb.fd, sb.inode, 8192);
  char* m3 = maps.map(pid, sc.id, sc.fd, sc.inode, 8192);
  ASSERT_TRUE(m1 != nullptr && m2 != nullptr && m3 != nullptr);
  EXPECT_EQ(maps.size(), 3u);
  b[300] = 5, c[300] = 6;
  EXPECT_EQ(m1[100], 42);
  EXPECT_EQ(m2[300], 5);
  EXPECT_EQ(m3[300], 6);
  maps.begin_op();
  ASSERT_NE(maps.map(pid, sc.id, sc.fd, sc.inode, 8192), nullptr);
  char* d = static_cast<char*>(shared_host_alloc(8192));
  auto sd = *find_shared_host(d, 1);
  ASSERT_NE(maps.map(pid, sd.id, sd.fd, sd.inode, 8192), nullptr);  // a later op: back to the limit
  EXPECT_EQ(maps.size(), 2u);
  shared_host_free(d);
  shared_host_free(a);
  shared_host_free(b);
  shared_host_free(c);
}

JobSpec zero_copy_job(int n, bool force_nt) {
  JobSpec s = one_host(n, "shm");
  s.options.shm_zero_copy_bytes = 1;  // every op past the one-round sizes
  if (force_nt) s.options.shm_nt_bytes = 0;
  return s;
}

// Runs all_reduce (f32 sum/avg, i32 max, bf16 sum, f64 max), reduce_scatter
// (f32 sum, bf16 avg), all_gather (f32, u8) and broadcast on shared buffers skewed by
// `skew` bytes, in and out of place; returns how many ops it issued.
uint64_t check_all_kinds(Backend& b, size_t count, size_t skew) {
  const int n = b.size(), me = b.rank();
  const std::string c = " count " + std::to_string(count) + " skew " + std::to_string(skew);
  uint64_t ops = 0;
  {
    SharedVec<float> in(count, skew), out(count, skew);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(contribution(me, i)), out[i] = -1.f;
    b.all_reduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum, kT)->wait();
    require_values(out.vec(), [&](size_t i) { return sum_over(n, i); }, "f32 sum out of place" + c);
    b.all_reduce(in.data(), in.data(), count, DType::kF32, ReduceOp::kAvg, kT)->wait();
    require_values(in.vec(), [&](size_t i) { return sum_over(n, i) / n; }, "f32 avg in place" + c, 1e-5);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(contribution(me, i));
    b.all_reduce(in.data(), in.data(), count, DType::kF32, ReduceOp::kSum, kT)->wait();
    require_values(in.vec(), [&](size_t i) { return sum_over(n, i); }, "f32 sum in place" + c);
    ops += 3;
  }
  {
    SharedVec<int32_t> x(count, skew);
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<int32_t>(contribution(me, i)) - 7;
    b.all_reduce(x.data(), x.data(), count, DType::kI32, ReduceOp::kMax, kT)->wait();
    require_values(x.vec(), [&](size_t i) { return max_over(n, i) - 7; }, "i32 max" + c);
    ops += 1;
  }
  {
    SharedVec<uint16_t> h(count, skew), out(count, skew);
    for (size_t i = 0; i < count; ++i) h[i] = kernels::float_to_bf16(static_cast<float>(contribution(me, i)));
    b.all_reduce(h.data(), out.data(), count, DType::kBF16, ReduceOp::kSum, kT)->wait();
    std::vector<float> f(count);
    for (size_t i = 0; i < count; ++i) f[i] = kernels::bf16_to_float(out[i]);
    require_values(f, [&](size_t i) { return sum_over(n, i); }, "bf16 sum" + c);
    ops += 1;
  }
  {
    SharedVec<double> d(count, skew);
    for (size_t i = 0; i < count; ++i) d[i] = contribution(me, i) + 0.25;
    b.all_reduce(d.data(), d.data(), count, DType::kF64, ReduceOp::kMax, kT)->wait();
    require_values(d.vec(), [&](size_t i) { return max_over(n, i) + 0.25; }, "f64 max" + c);
    ops += 1;
  }
  const size_t un = static_cast<size_t>(n), um = static_cast<size_t>(me);
  {
    // reduce_scatter: block `count` per rank; out of place, then in place.
    SharedVec<float> big(un * count, skew), mine(count, skew);
    for (size_t i = 0; i < un * count; ++i) big[i] = static_cast<float>(contribution(me, i));
    b.reduce_scatter(big.data(), mine.data(), count, DType::kF32, ReduceOp::kSum, kT)->wait();
    require_values(mine.vec(), [&](size_t i) { return sum_over(n, um * count + i); }, "reduce_scatter" + c);
    b.reduce_scatter(big.data(), big.data() + um * count, count, DType::kF32, ReduceOp::kSum, kT)->wait();
    std::vector<float> block(big.data() + um * count, big.data() + (um + 1) * count);
    require_values(block, [&](size_t i) { return sum_over(n, um * count + i); }, "reduce_scatter in place" + c);
    SharedVec<uint16_t> hb(un * count, skew), hm(count, skew);
    for (size_t i = 0; i < un * count; ++i) hb[i] = kernels::float_to_bf16(static_cast<float>(contribution(me, i)));
    b.reduce_scatter(hb.data(), hm.data(), count, DType::kBF16, ReduceOp::kAvg, kT)->wait();
    std::vector<float> f(count);
    for (size_t i = 0; i < count; ++i) f[i] = kernels::bf16_to_float(hm[i]);
    // bf16 keeps 8 significant bits: the average is within half an ulp.
    require_values(f, [&](size_t i) { return sum_over(n, um * count + i) / n; }, "reduce_scatter bf16 avg" + c,
                   0.05);
    ops += 3;
  }
  {
    SharedVec<float> in(count, skew), out(un * count, skew);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(contribution(me, i));
    for (size_t i = 0; i < un * count; ++i) out[i] = -1.f;
    b.all_gather(in.data(), out.data(), count, DType::kF32, kT)->wait();
    require_values(out.vec(), [&](size_t i) { return contribution(static_cast<int>(i / count), i % count); },
                   "all_gather" + c);
    SharedVec<uint8_t> bytes(un * count, skew);
    for (size_t i = 0; i < count; ++i) bytes[um * count + i] = static_cast<uint8_t>(contribution(me, i));
    b.all_gather(bytes.data() + um * count, bytes.data(), count, DType::kU8, kT)->wait();
    require_values(bytes.vec(), [&](size_t i) { return contribution(static_cast<int>(i / count), i % count); },
                   "all_gather u8 in place" + c);
    ops += 2;
  }
  {
    // reduce to rank 1 (rank 0 with one rank): f32 sum (the fused kernel
    // when aligned) and i32 max, in and out of place; only the root's
    // output is written.
    const int root = n > 1 ? 1 : 0;
    SharedVec<float> in(count, skew), out(count, skew);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(contribution(me, i)), out[i] = -1.f;
    b.reduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum, root, kT)->wait();
    if (me == root) {
      require_values(out.vec(), [&](size_t i) { return sum_over(n, i); }, "reduce f32 sum" + c);
    } else {
      require_values(out.vec(), [&](size_t) { return -1.0; }, "reduce wrote a non-root output" + c);
    }
    SharedVec<int32_t> x(count, skew);
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<int32_t>(contribution(me, i)) - 7;
    b.reduce(x.data(), x.data(), count, DType::kI32, ReduceOp::kMax, root, kT)->wait();
    if (me == root) require_values(x.vec(), [&](size_t i) { return max_over(n, i) - 7; }, "reduce i32 max" + c);
    ops += 2;
  }
  {
    // broadcast from the last rank
    const int root = n - 1;
    SharedVec<float> buf(count, skew);
    for (size_t i = 0; i < count; ++i) buf[i] = me == root ? static_cast<float>(contribution(root, i)) : -1.f;
    b.broadcast(buf.data(), count, DType::kF32, root, kT)->wait();
    require_values(buf.vec(), [&](size_t i) { return contribution(root, i); }, "broadcast" + c);
    ops += 1;
  }
  {
    // all_to_all, equal blocks: block q of rank r's input goes to rank q.
    SharedVec<float> in(un * count, skew), out(un * count, skew);
    for (size_t i = 0; i < un * count; ++i) in[i] = static_cast<float>(contribution(me, i)), out[i] = -1.f;
    std::vector<size_t> counts(un, count);
    b.all_to_all(in.data(), out.data(), counts, counts, DType::kF32, kT)->wait();
    require_values(out.vec(), [&](size_t i) { return contribution(static_cast<int>(i / count), um * count + i % count); },
                   "all_to_all" + c);
    ops += 1;
  }
  {
    // all_to_all, uneven blocks: rank r sends count + r * n + q elements to
    // q (at least one), so every block has its own size and offset.
    std::vector<size_t> send(un), recv(un), soff(un + 1, 0), roff(un + 1, 0);
    for (size_t q = 0; q < un; ++q) {
      send[q] = count + um * un + q;
      recv[q] = count + q * un + um;
      soff[q + 1] = soff[q] + send[q];
      roff[q + 1] = roff[q] + recv[q];
    }
    SharedVec<float> in(soff[un], skew), out(roff[un], skew);
    for (size_t i = 0; i < soff[un]; ++i) in[i] = static_cast<float>(contribution(me, i));
    for (size_t i = 0; i < roff[un]; ++i) out[i] = -1.f;
    b.all_to_all(in.data(), out.data(), send, recv, DType::kF32, kT)->wait();
    for (size_t q = 0; q < un; ++q) {
      size_t from = 0;  // where q's block for this rank starts in q's input
      for (size_t p = 0; p < um; ++p) from += count + q * un + p;
      for (size_t i = 0; i < recv[q]; ++i) {
        require(out[roff[q] + i] == static_cast<float>(contribution(static_cast<int>(q), from + i)),
                "uneven all_to_all: element " + std::to_string(i) + " from rank " + std::to_string(q) + c);
      }
    }
    ops += 1;
  }
  return ops;
}

class ZeroCopyRanks : public testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ZeroCopyRanks, ResultsMatchClosedForms) {
  const auto [n, force_nt] = GetParam();
  auto results = run_job(zero_copy_job(n, force_nt), [&](Backend& b, int) {
    const uint64_t before = host_zero_copy_ops();
    uint64_t issued = 0;
    // Past the one-round sizes (16 KiB) for every op and dtype; odd counts
    // leave tails shorter than a vector and blocks that do not divide.
    for (size_t count : {size_t{20000}, size_t{100003}}) {
      for (size_t skew : {size_t{0}, size_t{4}, size_t{64}}) issued += check_all_kinds(b, count, skew);
    }
    const uint64_t took = host_zero_copy_ops() - before;
    require(took == issued, "zero-copy ops: " + std::to_string(took) + " of " + std::to_string(issued));
  });
  expect_all_ok(results);
}

INSTANTIATE_TEST_SUITE_P(Ofi, ZeroCopyRanks,
                         testing::Combine(testing::Values(2, 3, 4), testing::Values(false, true)));

// Blocks of the pool, at offsets inside slabs shared with other blocks and
// over several slabs (2 MiB each here): the peers map the slabs and find
// the blocks at their offsets.
TEST(ZeroCopy, PoolBlocksTakeThePath) {
  auto results = run_job(zero_copy_job(3, false), [&](Backend& b, int) {
    g_pool_buffers = true;
    set_shared_host_pool_options({size_t{2} << 20, size_t{1} << 20});
    void* spacer = shared_host_pool_alloc(12345);  // no block starts its slab by chance alone
    const uint64_t before = host_zero_copy_ops();
    uint64_t issued = 0;
    for (size_t count : {size_t{20000}, size_t{100003}}) issued += check_all_kinds(b, count, 4);
    const uint64_t took = host_zero_copy_ops() - before;
    shared_host_pool_free(spacer);
    require(took == issued, "zero-copy ops on pool blocks: " + std::to_string(took) + " of " + std::to_string(issued));
    require(shared_host_pool_stats().slabs_made >= 2, "the test never used a second slab");
  });
  expect_all_ok(results);
}

// Two (fake) hosts of two ranks: the hierarchical all_reduce's reduce-
// scatter and all-gather on each host take the zero-copy path on shared
// buffers (two zero-copy ops per all_reduce), in and out of place, with
// the closed-form results; with a heap buffer on one rank, its host's
// phases take the stripes and the results are the same.
TEST(ZeroCopy, HierarchicalAllReduceHostPhases) {
  JobSpec spec = zero_copy_job(4, false);
  spec.host_of = {0, 0, 1, 1};
  auto results = run_job(spec, [&](Backend& b, int rank) {
    const int n = b.size();
    const size_t count = 100003;  // past the recursive-doubling sizes: the reduce-scatter form
    const uint64_t before = host_zero_copy_ops();
    for (size_t skew : {size_t{0}, size_t{4}}) {  // aligned blocks may take the fused kernel
      SharedVec<float> in(count, skew), out(count, skew);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(contribution(rank, i)), out[i] = -1.f;
      b.all_reduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum, kT)->wait();
      require_values(out.vec(), [&](size_t i) { return sum_over(n, i); }, "hierarchical all_reduce");
      b.all_reduce(in.data(), in.data(), count, DType::kF32, ReduceOp::kAvg, kT)->wait();
      require_values(in.vec(), [&](size_t i) { return sum_over(n, i) / n; }, "hierarchical all_reduce avg in place",
                     1e-5);
    }
    require(host_zero_copy_ops() - before == 8,
            "zero-copy host phases: " + std::to_string(host_zero_copy_ops() - before) + " of 8");
    std::vector<float> heap(count);
    SharedVec<float> shared(count);
    float* x = rank == 2 ? heap.data() : shared.data();
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(contribution(rank, i));
    const uint64_t mid = host_zero_copy_ops();
    b.all_reduce(x, x, count, DType::kF32, ReduceOp::kMax, kT)->wait();
    require_values(std::vector<float>(x, x + count), [&](size_t i) { return max_over(n, i); },
                   "hierarchical all_reduce, one heap buffer");
    require(host_zero_copy_ops() - mid == (rank < 2 ? 2u : 0u), "the heap buffer's host took the path, or the other did not");
  });
  expect_all_ok(results);
}

// One rank with ordinary buffers where peers need them: every rank takes
// the stripes (the same answer everywhere), and the results are right;
// ordinary buffers that only their owner touches do not stop the path.
TEST(ZeroCopy, MixedBuffersFallBackToTheStripes) {
  auto results = run_job(zero_copy_job(3, true), [&](Backend& b, int rank) {
    const int n = b.size();
    const size_t count = 50001;
    const uint64_t before = host_zero_copy_ops();
    std::vector<float> heap_in = filled(rank, count), heap_out(count, -1.f);
    SharedVec<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(contribution(rank, i)), out[i] = -1.f;
    float* src = rank == 1 ? heap_in.data() : in.data();
    float* dst = rank == 1 ? heap_out.data() : out.data();
    b.all_reduce(src, dst, count, DType::kF32, ReduceOp::kSum, kT)->wait();
    std::vector<float> got = rank == 1 ? heap_out : out.vec();
    require_values(got, [&](size_t i) { return sum_over(n, i); }, "mixed all_reduce");
    // Shared input, ordinary output on rank 2 only.
    std::vector<float> gathered(static_cast<size_t>(n) * count, -1.f);
    SharedVec<float> sg(static_cast<size_t>(n) * count);
    b.all_gather(in.data(), rank == 2 ? gathered.data() : sg.data(), count, DType::kF32, kT)->wait();
    std::vector<float> g = rank == 2 ? gathered : sg.vec();
    require_values(g, [&](size_t i) { return contribution(static_cast<int>(i / count), i % count); },
                   "mixed all_gather");
    // Uneven all_to_all blocks with a heap input on rank 1: the stripes.
    std::vector<size_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) {
      send[static_cast<size_t>(q)] = 20000 + static_cast<size_t>(rank * n + q);  // to q
      recv[static_cast<size_t>(q)] = 20000 + static_cast<size_t>(q * n + rank);  // from q
    }
    size_t sends = 0, recvs = 0;
    for (int q = 0; q < n; ++q) sends += send[static_cast<size_t>(q)], recvs += recv[static_cast<size_t>(q)];
    SharedVec<float> a_shared(sends), a_out(recvs);
    std::vector<float> a_heap(sends);
    float* a_in = rank == 1 ? a_heap.data() : a_shared.data();
    for (size_t i = 0; i < sends; ++i) a_in[i] = static_cast<float>(rank * 1000000 + static_cast<int>(i));
    b.all_to_all(a_in, a_out.data(), send, recv, DType::kF32, kT)->wait();
    size_t at = 0;
    for (int q = 0; q < n; ++q) {
      size_t off = 0;  // where q's block for this rank starts in q's input
      for (int p = 0; p < rank; ++p) off += 20000 + static_cast<size_t>(q * n + p);
      for (size_t i = 0; i < recv[static_cast<size_t>(q)]; ++i, ++at) {
        require(a_out[at] == static_cast<float>(q * 1000000 + static_cast<int>(off + i)),
                "uneven all_to_all: element " + std::to_string(at) + " from rank " + std::to_string(q));
      }
    }
    // Equal blocks, shared input everywhere but on rank 1: ranks 0 and 2
    // offer zero-copy (and carry no data in the first round), rank 1 does
    // not; all take the stripes from the first one.
    {
      const size_t blk = 30001;
      const size_t un = static_cast<size_t>(n);
      std::vector<size_t> eq(un, blk);
      std::vector<float> heap_a(un * blk);
      SharedVec<float> sh_a(un * blk), sh_b(un * blk);
      float* a_src = rank == 1 ? heap_a.data() : sh_a.data();
      for (size_t i = 0; i < un * blk; ++i) a_src[i] = static_cast<float>(rank * 1000000 + static_cast<int>(i));
      b.all_to_all(a_src, sh_b.data(), eq, eq, DType::kF32, kT)->wait();
      for (size_t i = 0; i < un * blk; ++i) {
        const int q = static_cast<int>(i / blk);
        const size_t from = static_cast<size_t>(rank) * blk + i % blk;
        require(sh_b[i] == static_cast<float>(q * 1000000 + static_cast<int>(from)),
                "mixed all_to_all: element " + std::to_string(i));
      }
    }
    require(host_zero_copy_ops() == before, "an op with ordinary buffers took the zero-copy path");
    // Only the buffers peers touch must be shared: a broadcast's root buffer,
    // a reduce_scatter's inputs.
    const int root = 0;
    std::vector<float> heap_buf(count, -1.f);
    SharedVec<float> root_buf(count);
    for (size_t i = 0; i < count; ++i) root_buf[i] = static_cast<float>(contribution(root, i));
    float* bb = rank == root ? root_buf.data() : heap_buf.data();
    b.broadcast(bb, count, DType::kF32, root, kT)->wait();
    require_values(std::vector<float>(bb, bb + count), [&](size_t i) { return contribution(root, i); },
                   "broadcast into heap buffers");
    require(host_zero_copy_ops() == before + 1, "a broadcast from a shared root buffer did not take the path");
    SharedVec<float> rs_in(static_cast<size_t>(n) * count);
    for (size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = static_cast<float>(contribution(rank, i));
    std::vector<float> rs_out(count, -1.f);
    b.reduce_scatter(rs_in.data(), rs_out.data(), count, DType::kF32, ReduceOp::kSum, kT)->wait();
    require_values(rs_out, [&](size_t i) { return sum_over(n, static_cast<size_t>(rank) * count + i); },
                   "reduce_scatter into heap outputs");
    require(host_zero_copy_ops() == before + 2, "a reduce_scatter of shared inputs did not take the path");
    // reduce: shared inputs and the root's output; the others' outputs heap.
    std::vector<float> red_heap(count, -1.f);
    SharedVec<float> red_root(count);
    b.reduce(in.data(), rank == root ? red_root.data() : red_heap.data(), count, DType::kF32, ReduceOp::kSum, root,
             kT)->wait();
    if (rank == root) require_values(red_root.vec(), [&](size_t i) { return sum_over(n, i); }, "reduce, heap elsewhere");
    require(host_zero_copy_ops() == before + 3, "a reduce of shared inputs into a shared root did not take the path");
    // And all shared again: zero-copy.
    b.all_reduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum, kT)->wait();
    require_values(out.vec(), [&](size_t i) { return sum_over(n, i); }, "all-shared all_reduce after");
    require(host_zero_copy_ops() == before + 4, "the all-shared op did not take the zero-copy path");
  });
  expect_all_ok(results);
}

// Each op on freshly allocated buffers: more regions than a group keeps
// mapped (64), so the peers evict and remap; a freed region's address may
// come back for a new one, whose id differs.
TEST(ZeroCopy, ManyRegionsAreMappedEvictedAndRemapped) {
  auto results = run_job(zero_copy_job(2, false), [&](Backend& b, int rank) {
    const int n = b.size();
    const uint64_t before = host_zero_copy_ops();
    for (int it = 0; it < 80; ++it) {
      const size_t c = 8192 + static_cast<size_t>(it % 5);
      SharedVec<float> buf(c);
      for (size_t i = 0; i < c; ++i) buf[i] = static_cast<float>(contribution(rank, i + static_cast<size_t>(it)));
      b.all_reduce(buf.data(), buf.data(), c, DType::kF32, ReduceOp::kSum, kT)->wait();
      require_values(buf.vec(), [&](size_t i) { return sum_over(n, i + static_cast<size_t>(it)); },
                     "iteration " + std::to_string(it));
    }
    require(host_zero_copy_ops() == before + 80,
            "zero-copy ops: " + std::to_string(host_zero_copy_ops() - before) + " of 80");
  });
  expect_all_ok(results);
}

// A peer dies instead of joining a zero-copy all_reduce: the others fail
// within the deadline, naming it.
TEST(ZeroCopy, DeadPeerIsNamed) {
  const Ms deadline(5000);
  auto results = run_job(zero_copy_job(3, false), [&](Backend& b, int rank) {
    SharedVec<float> buf(100000);
    b.all_reduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kSum, kT)->wait();
    b.barrier(kT)->wait();
    if (rank == 2) {
      std::this_thread::sleep_for(Ms(20));
      ::raise(SIGKILL);
    }
    const Failure f = failure_of(
        [&] { b.all_reduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kSum, deadline)->wait(); },
        "an all_reduce with a dead peer succeeded");
    require(!f.invalid, "a dead peer reported as bad input: " + f.message);
    require(f.took <= deadline + Ms(2000), "failed only after " + std::to_string(f.took.count()) + " ms: " + f.message);
    require(f.message.find("world rank 2") != std::string::npos, "the error does not name the dead peer: " + f.message);
  });
  expect_victim_died(results, 2);
}

// A zero-copy all_to_all whose ranks disagree on a block's size: rank 0
// expects more from rank 1 than rank 1 sends. Rank 0 refuses to read past
// rank 1's block (InvalidArgument naming rank 1) and the others fail
// within the deadline instead of hanging.
TEST(ZeroCopy, AllToAllCountsThatDisagreeAreRefused) {
  const Ms deadline(5000);
  auto results = run_job(zero_copy_job(3, false), [&](Backend& b, int rank) {
    const size_t blk = 30000, un = 3;
    std::vector<size_t> send(un, blk), recv(un, blk);
    if (rank == 0) recv[1] = blk + 5;
    SharedVec<float> in(un * blk), out(un * blk + 5);
    const Failure f = failure_of([&] { b.all_to_all(in.data(), out.data(), send, recv, DType::kF32, deadline)->wait(); },
                                 "an all_to_all with disagreeing counts succeeded");
    require(f.took <= deadline + Ms(2000), "failed only after " + std::to_string(f.took.count()) + " ms: " + f.message);
    if (rank == 0) {
      require(f.invalid && f.message.find("world rank 1 sends 120000 bytes") != std::string::npos &&
                  f.message.find("disagree") != std::string::npos,
              "rank 0 did not name the disagreement: " + f.message);
    }
  });
  expect_all_ok(results);
}

}  // namespace
}  // namespace torus::comm::ofi::test
