// Peak FLOP/s for MFU (peak_flops.h, Note [Honest MFU] in train_loop.h).
#include "torus/run/peak_flops.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/log.h"
#include "torus/comm/context.h"

namespace torus::run {
namespace {

using Clock = std::chrono::steady_clock;

struct DevicePeak {
  const char* name;  // substring of the device name
  double half;       // bf16 / f16 dense tensor-core FLOP/s
  double f32;        // f32 FMA FLOP/s (no TF32)
  bool bf16 = true;  // V100 has no bf16 tensor cores
};

// Datasheet dense peaks (no sparsity). More specific names first.
constexpr DevicePeak kCudaPeaks[] = {
    {"H200", 989.4e12, 66.9e12},     {"H100 PCIe", 756.0e12, 51.2e12}, {"H100", 989.4e12, 66.9e12},
    {"A100", 312.0e12, 19.5e12},     {"V100", 125.0e12, 15.7e12, false},
};

// Waits for `work` without spinning a core (the host's other ranks must stay
// idle while local rank 0 measures).
void wait_idle(const comm::WorkPtr& work) {
  while (!work->is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  work->wait();
}

}  // namespace

double cuda_dense_peak_flops(const std::string& device_name, c10::ScalarType dtype) {
  for (const auto& p : kCudaPeaks) {
    if (device_name.find(p.name) == std::string::npos) continue;
    if (dtype == at::kBFloat16) return p.bf16 ? p.half : 0.0;
    if (dtype == at::kHalf) return p.half;
    if (dtype == at::kFloat) return p.f32;
    return 0.0;
  }
  return 0.0;
}

double measure_cpu_gemm_flops(c10::ScalarType dtype, int threads, int64_t n) {
  TORUS_CHECK(threads >= 1 && n >= 16, InvalidArgument, "measure_cpu_gemm_flops: threads {} n {}", threads, n);
  const int previous = at::get_num_threads();
  at::set_num_threads(threads);
  struct Restore {
    int n;
    ~Restore() { at::set_num_threads(n); }
  } restore{previous};
  const auto opts = at::TensorOptions().dtype(dtype);
  at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts), c = at::empty({n, n}, opts);
  at::mm_out(c, a, b);  // warm-up
  double best = 0;
  for (int window = 0; window < 3; ++window) {
    int64_t iters = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    while (elapsed < 0.25) {
      at::mm_out(c, a, b);
      ++iters;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) * static_cast<double>(iters) / elapsed);
  }
  return best;
}

double measure_job_cpu_peak_flops(const comm::ProcessGroupPtr& world, c10::ScalarType dtype) {
  TORUS_CHECK(world != nullptr, InvalidArgument, "measure_job_cpu_peak_flops: null group");
  const comm::LaunchInfo& launch = world->context()->launch();
  const bool measures = launch.local_rank == 0;
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  if (world->size() > 1) wait_idle(world->barrier());
  double mine = measures ? measure_cpu_gemm_flops(dtype, cores) : 0.0;
  if (measures && dtype != at::kFloat && dtype != at::kDouble) {
    mine = std::max(mine, measure_cpu_gemm_flops(at::kFloat, cores));  // the header says why
  }
  at::Tensor sum = at::full({1}, mine, at::TensorOptions().dtype(at::kDouble));
  if (world->size() > 1) {
    auto work = world->all_reduce(sum);
    wait_idle(work);
  }
  return sum.item<double>();
}

}  // namespace torus::run
