// Freed host memory stays in the process (host_allocator.h).
#include "torus/core/host_allocator.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <climits>
#include <mutex>

#include "core/log.h"

namespace torus {

HostAllocatorSettings retain_freed_host_memory() {
  static std::once_flag once;
  static HostAllocatorSettings settings;
  std::call_once(once, [] {
#if defined(__GLIBC__)
    // glibc's ceiling for the mmap threshold: 4 MiB * sizeof(long).
    const size_t mmap_threshold = (size_t{4} << 20) * sizeof(long);
    const bool ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) == 1 &&
                    mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
    settings = {ok, ok ? mmap_threshold : 0, ok ? static_cast<size_t>(INT_MAX) : 0};
    if (ok) {
      TORUS_LOG_DEBUG("host allocator: mmap threshold {} bytes, heap trimming off", mmap_threshold);
    } else {
      TORUS_LOG_WARN("host allocator: mallopt refused the settings; freed memory may return to the kernel");
    }
#endif
  });
  return settings;
}

}  // namespace torus
