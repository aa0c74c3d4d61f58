// TEMPORARY measurement probe (not a test): all_reduce latency/bandwidth of
// the ofi backend on forked ranks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ofi_world.h"

using namespace torus;
using namespace torus::comm;
using namespace torus::comm::ofi::test;

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 2;
  const char* prov = argc > 2 ? argv[2] : "shm";
  bool seg = argc > 3 ? std::atoi(argv[3]) != 0 : true;
  size_t max_bytes = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : (size_t{64} << 20);
  JobSpec spec = one_host(n, prov, seg);
  spec.options = ofi::OfiOptions::from_env();
  spec.options.provider = prov;
  spec.options.host_shm = seg;
  spec.test_deadline = std::chrono::seconds(600);
  auto res = run_job(spec, [&](Backend& b, int rank) {
    for (size_t bytes : {size_t{8}, size_t{1024}, size_t{65536}, size_t{1} << 20, size_t{16} << 20, size_t{64} << 20}) {
      if (bytes > max_bytes) break;
      size_t count = bytes / 4;
      std::vector<float> in(count, 1.f), out(count);
      int iters = bytes <= 64 ? 200000 : bytes <= 65536 ? 20000 : bytes <= (1 << 20) ? 200 : 20;
      for (int i = 0; i < 5; ++i) b.all_reduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum, Duration(60000))->wait();
      std::vector<double> ts;
      for (int rep = 0; rep < 5; ++rep) {
        b.barrier(Duration(60000))->wait();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) b.all_reduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum, Duration(60000))->wait();
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
      }
      std::sort(ts.begin(), ts.end());
      double t = ts[ts.size() / 2];
      if (rank == 0) std::fprintf(stderr, "%10zu B  %10.2f us  busbw %.2f GB/s  check %g\n", bytes, t * 1e6, bytes / t / 1e9 * 2 * (n - 1) / n, out[0]);
    }
  });
  for (auto& r : res) if (!r.exited_ok()) std::printf("rank failed: %s\n", r.output.c_str());
}
