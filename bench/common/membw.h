// bench/common/membw.h — the memory-bandwidth probe that every benchmark
// prints beside its numbers: how fast one core copies a buffer far larger
// than the caches. On one host, moving data between processes cannot beat
// this by much, so it is the yardstick for the busbw of host collectives.
//
// Dependency free (standard library only), so peers that must not link Torus
// (bench/collectives/mpi_peer.cpp) can use it too.
#pragma once

#include <cstddef>
#include <string>

namespace torus::bench {

struct MemcpyProbe {
  size_t bytes = 0;    // size of one copy
  int runs = 0;        // timed copies
  double seconds = 0;  // median time of one copy
  double gbps = 0;     // bytes / seconds / 1e9 (bytes copied, not read+write traffic)
};

// Copies `bytes` between two page-aligned buffers `runs` times on the calling
// thread, after one untimed copy that faults the pages in, and returns the
// median. Blocks for roughly runs * bytes / (10 GB/s). Not thread safe with
// respect to the measurement: other busy threads or processes on the same
// core lower the result.
MemcpyProbe memcpy_probe(size_t bytes = size_t{64} << 20, int runs = 9);

// "memcpy 64 MiB, 1 core: 13.20 GB/s (median of 9)"
std::string describe(const MemcpyProbe& probe);

}  // namespace torus::bench
