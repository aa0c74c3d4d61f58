// bench/common/membw.cpp — single-core memcpy probe (see membw.h).
#include "membw.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "sweep.h"

namespace torus::bench {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

std::unique_ptr<char, FreeDeleter> alloc_pages(size_t bytes) {
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  auto* p = static_cast<char*>(std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded));
  if (p == nullptr) throw std::bad_alloc();
  return std::unique_ptr<char, FreeDeleter>(p);
}

// Keeps the compiler from proving the copy dead (the buffers are never read).
inline void escape(void* p) {
  asm volatile("" : : "g"(p) : "memory");
}

}  // namespace

MemcpyProbe memcpy_probe(size_t bytes, int runs) {
  auto src = alloc_pages(bytes);
  auto dst = alloc_pages(bytes);
  std::memset(src.get(), 0x5a, bytes);
  std::memcpy(dst.get(), src.get(), bytes);  // faults dst in; not timed
  escape(dst.get());

  std::vector<double> times;
  for (int i = 0; i < std::max(runs, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.get(), src.get(), bytes);
    escape(dst.get());
    const auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  MemcpyProbe probe;
  probe.bytes = bytes;
  probe.runs = static_cast<int>(times.size());
  probe.seconds = median(times);
  probe.gbps = probe.seconds > 0 ? static_cast<double>(bytes) / probe.seconds / 1e9 : 0.0;
  return probe;
}

std::string describe(const MemcpyProbe& probe) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "memcpy %s, 1 core: %.2f GB/s (median of %d)", human_size(probe.bytes).c_str(),
                probe.gbps, probe.runs);
  return buf;
}

}  // namespace torus::bench
