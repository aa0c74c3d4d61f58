// retain_freed_host_memory(): a large block freed and allocated again is
// served from memory the process already touched, not from fresh pages.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include "torus/core/host_allocator.h"

namespace torus {
namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Page faults taken by allocating, touching and freeing `bytes`.
long faults_of_one_cycle(size_t bytes) {
  const long before = minor_faults();
  char* p = static_cast<char*>(std::malloc(bytes));
  if (p == nullptr) return -1;
  std::memset(p, 1, bytes);
  volatile char sink = p[bytes - 1];
  (void)sink;
  std::free(p);
  return minor_faults() - before;
}

TEST(HostAllocator, FreedBlocksAreReusedWithoutPageFaults) {
  const HostAllocatorSettings s = retain_freed_host_memory();
#if !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc: retain_freed_host_memory() does nothing here";
#endif
  ASSERT_TRUE(s.applied);
  EXPECT_EQ(s.mmap_threshold, (size_t{4} << 20) * sizeof(long));
  const size_t bytes = size_t{16} << 20;  // a logits-sized block, below the threshold
  const long pages = static_cast<long>(bytes / 4096);
  faults_of_one_cycle(bytes);  // first touch: the heap grows
  // Without the settings every cycle faults on each of the 4096 pages (a
  // fresh mapping, or a trimmed heap top); with them, (almost) none does.
  for (int i = 0; i < 3; ++i) EXPECT_LT(faults_of_one_cycle(bytes), pages / 16) << "cycle " << i;
  EXPECT_EQ(retain_freed_host_memory().mmap_threshold, s.mmap_threshold);  // idempotent
}

}  // namespace
}  // namespace torus
