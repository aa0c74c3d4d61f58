// Peak FLOP/s for MFU (peak_flops.h, Note [Honest MFU] in train_loop.h).
#include "torus/run/peak_flops.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "core/log.h"
#include "torus/comm/context.h"
#include "torus/device/hardware.h"
#include "torus/device/peak_cache.h"

namespace torus::run {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kWarmupSeconds = 0.3;
constexpr int kTrials = 9;
constexpr double kTrialSeconds = 0.1;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Waits for `work` without spinning a core (the host's other ranks must stay
// idle while local rank 0 measures).
void wait_idle(const comm::WorkPtr& work) {
  while (!work->is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  work->wait();
}

}  // namespace

double cuda_dense_peak_flops(const std::string& device_name, c10::ScalarType dtype) {
  const device::DeviceSpec* d = device::match_device(device_name);
  if (d == nullptr || d->kind != "gpu") return 0.0;
  if (dtype == at::kBFloat16) return d->peak_flops_bf16;
  if (dtype == at::kHalf) return d->peak_flops_fp16;
  if (dtype == at::kFloat) return d->peak_flops_32;
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
  // Warm-up: the thread pool starts, the pages are touched, the clock ramps up.
  const auto warm = Clock::now();
  do {
    at::mm_out(c, a, b);
  } while (seconds_since(warm) < kWarmupSeconds);
  // Best of several short trials: another process that takes a core for a
  // while slows some trials, rarely all (Note [Stable CPU peak]).
  double best = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    int64_t iters = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    while (elapsed < kTrialSeconds || iters < 2) {
      at::mm_out(c, a, b);
      ++iters;
      elapsed = seconds_since(t0);
    }
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) * static_cast<double>(iters) / elapsed);
  }
  return best;
}

JobPeak measure_job_cpu_peak_flops(const comm::ProcessGroupPtr& world, c10::ScalarType dtype) {
  TORUS_CHECK(world != nullptr, InvalidArgument, "measure_job_cpu_peak_flops: null group");
  const comm::Context& context = *world->context();
  const bool measures = context.launch().local_rank == 0;
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  // Every rank has arrived (none is still building its model), then the
  // host's other ranks sleep on the store until its local rank 0 is done: a
  // rank inside a collective polls its backend (Note [Stable CPU peak]).
  static std::atomic<int> calls{0};
  const int call = calls++;  // collective: the same count on every rank
  const bool wait_on_store = world->size() > 1 && context.store() != nullptr &&
                             context.hosts().host_of_rank.size() == static_cast<size_t>(context.world_size());
  const std::string done_key =
      wait_on_store ? fmt::format("torus/peak/{}/host-{}", call, context.hosts().host_of_rank[context.rank()]) : "";
  if (world->size() > 1) wait_idle(world->barrier());

  double mine = 0;
  int64_t cached_at = 0;  // seconds since the epoch; 0: measured now
  if (measures) {
    const device::PeakKey key = device::host_peak_key(std::string(c10::toString(dtype)), cores);
    const std::string& cache = device::peak_cache_path();
    if (auto hit = device::read_cached_peak(cache, key)) {
      mine = hit->flops;
      cached_at = std::max<int64_t>(1, hit->measured_unix);
    } else {
      mine = measure_cpu_gemm_flops(dtype, cores);
      if (dtype != at::kFloat && dtype != at::kDouble) {
        mine = std::max(mine, measure_cpu_gemm_flops(at::kFloat, cores));  // the header says why
      }
      device::write_cached_peak(cache, key, mine);
    }
    if (wait_on_store) context.store()->set(done_key, {1});
  } else if (wait_on_store) {
    context.store()->wait({done_key}, context.default_timeout());
  }

  // The hosts' sum, how many hosts measured, and the newest cached figure's date.
  at::Tensor sum = at::tensor({mine, measures && cached_at == 0 ? 1.0 : 0.0, measures ? 1.0 : 0.0},
                              at::TensorOptions().dtype(at::kDouble));
  at::Tensor newest = at::full({1}, static_cast<double>(cached_at), at::TensorOptions().dtype(at::kDouble));
  if (world->size() > 1) {
    wait_idle(world->all_reduce(sum));
    comm::AllReduceOptions max;
    max.op = comm::ReduceOp::kMax;
    wait_idle(world->all_reduce(newest, max));
  }
  const auto measured = static_cast<int64_t>(sum[1].item<double>());
  const auto hosts = static_cast<int64_t>(sum[2].item<double>());
  JobPeak out;
  out.flops = sum[0].item<double>();
  const std::string date = device::format_utc_date(static_cast<int64_t>(newest.item<double>()));
  if (measured == hosts) {
    out.source = "measured";
  } else if (measured == 0) {
    out.source = "cached from " + date;
  } else {
    out.source =
        fmt::format("measured on {} of {} hosts, cached (newest from {}) on the others", measured, hosts, date);
  }
  return out;
}

}  // namespace torus::run
