// The CPU Adam kernel's dispatch: the ISA path (runtime detection, forcing),
// the constants, found_inf, and the split of the elements over ATen's pool.
// Compiled for the baseline ISA; the vector loops live in cpu_adam_avx2.cpp
// and cpu_adam_avx512.cpp.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "cpu_adam_math.h"
#include "torus/core/params.h"
#include "torus/optim/cpu_adam_kernel.h"

namespace torus::optim::cpu {
namespace {

using detail::AdamConsts;
using RangeFn = void (*)(const AdamConsts&, const AdamSlice&, int64_t, int64_t);

// Below this many elements per worker, another worker costs more than it saves.
constexpr int64_t kMinPerWorker = 32768;
// Worker ranges start on multiples of this (64 elements: whole cache lines of
// every array when they are 64-byte aligned); results do not depend on it.
constexpr int64_t kSplitAlign = 64;

bool cpu_has(Isa isa) {
#if defined(__x86_64__) && defined(TORUS_CPU_ADAM_X86)
  switch (isa) {
    case Isa::kAuto:
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
  }
  return false;
#else
  return isa == Isa::kAuto || isa == Isa::kScalar;
#endif
}

Isa resolve(Isa isa) {
  if (isa == Isa::kAuto) {
    // TORUS_CPU_ADAM_ISA, checked by EnvParams::from_env.
    const std::string& forced = env_params().cpu_adam_isa;
    isa = forced.empty() ? Isa::kAuto : parse_isa(forced);
    if (isa == Isa::kAuto) return best_isa();
  }
  TORUS_CHECK(cpu_has(isa), Unsupported, "CPU Adam: this CPU (or build) has no {} path (best: {})", isa_name(isa),
              isa_name(best_isa()));
  return isa;
}

RangeFn range_fn(Isa isa) {
  switch (isa) {
#if defined(TORUS_CPU_ADAM_X86)
    case Isa::kAvx512:
      return &detail::adam_range_avx512;
    case Isa::kAvx2:
      return &detail::adam_range_avx2;
#endif
    default:
      return &detail::adam_range_scalar;
  }
}

AdamConsts consts_of(const AdamHyper& h) {
  TORUS_CHECK(std::isfinite(h.lr) && h.lr >= 0, InvalidArgument, "CPU Adam: lr must be >= 0, got {}", h.lr);
  TORUS_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1, InvalidArgument,
              "CPU Adam: betas must be in [0, 1), got ({}, {})", h.beta1, h.beta2);
  TORUS_CHECK(std::isfinite(h.eps) && h.eps > 0, InvalidArgument, "CPU Adam: eps must be > 0, got {}", h.eps);
  TORUS_CHECK(std::isfinite(h.weight_decay) && h.weight_decay >= 0, InvalidArgument,
              "CPU Adam: weight decay must be >= 0, got {}", h.weight_decay);
  TORUS_CHECK(h.step >= 1, InvalidArgument, "CPU Adam: step must be >= 1 (the 1-based update count), got {}", h.step);
  const double t = static_cast<double>(h.step);
  const double bc1 = 1.0 - std::pow(h.beta1, t);
  const double bc2 = 1.0 - std::pow(h.beta2, t);
  return AdamConsts{.b1 = static_cast<float>(h.beta1),
                    .omb1 = static_cast<float>(1.0 - h.beta1),
                    .b2 = static_cast<float>(h.beta2),
                    .omb2 = static_cast<float>(1.0 - h.beta2),
                    .eps = static_cast<float>(h.eps),
                    .wd = static_cast<float>(h.weight_decay),
                    .decay = static_cast<float>(1.0 - h.lr * h.weight_decay),
                    .step_size = static_cast<float>(h.lr / bc1),
                    .rbc2 = static_cast<float>(1.0 / std::sqrt(bc2)),
                    .grad_scale = h.grad_scale,
                    .decoupled = h.decoupled,
                    .decay_on = h.weight_decay != 0};
}

void check_slice(const AdamSlice& s, size_t k) {
  TORUS_CHECK(s.numel >= 0, InvalidArgument, "CPU Adam: slice {} has numel {}", k, s.numel);
  if (s.numel == 0) return;
  TORUS_CHECK(s.param && s.grad && s.exp_avg && s.exp_avg_sq, InvalidArgument,
              "CPU Adam: slice {} ({} elements) has a null param, grad, exp_avg or exp_avg_sq", k, s.numel);
}

}  // namespace

Isa best_isa() {
  static const Isa best = cpu_has(Isa::kAvx512) ? Isa::kAvx512 : cpu_has(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar;
  return best;
}

bool isa_supported(Isa isa) {
  return cpu_has(isa);
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
      return "auto";
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

Isa parse_isa(std::string_view name) {
  for (Isa isa : {Isa::kAuto, Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (name == isa_name(isa)) return isa;
  }
  throw InvalidArgument(fmt::format("CPU Adam: ISA '{}' is not one of auto, scalar, avx2, avx512", name));
}

void adam_update(const AdamHyper& hyper, const AdamSlice& slice, int threads, Isa isa) {
  adam_update(std::span<const AdamHyper>(&hyper, 1), std::span<const AdamSlice>(&slice, 1), threads, isa);
}

void adam_update(std::span<const AdamHyper> hypers, std::span<const AdamSlice> slices, int threads, Isa isa) {
  TORUS_CHECK(hypers.size() == 1 || hypers.size() == slices.size(), InvalidArgument,
              "CPU Adam: {} hyper-parameter sets for {} slices (give 1 or one per slice)", hypers.size(),
              slices.size());
  TORUS_CHECK(threads >= 0, InvalidArgument, "CPU Adam: threads must be >= 0, got {}", threads);
  const RangeFn fn = range_fn(resolve(isa));
  // Check everything and read every found_inf before any element changes.
  std::vector<AdamConsts> consts;
  consts.reserve(hypers.size());
  for (const AdamHyper& h : hypers) consts.push_back(consts_of(h));
  std::vector<size_t> live;  // the slices to update
  std::vector<int64_t> starts{0};  // starts[j]: the first global element of live[j]
  for (size_t k = 0; k < slices.size(); ++k) {
    check_slice(slices[k], k);
    const AdamHyper& h = hypers.size() == 1 ? hypers[0] : hypers[k];
    if (slices[k].numel == 0 || (h.found_inf != nullptr && *h.found_inf != 0.0f)) continue;
    live.push_back(k);
    starts.push_back(starts.back() + slices[k].numel);
  }
  const int64_t total = starts.back();
  if (total == 0) return;
  auto consts_for = [&](size_t k) -> const AdamConsts& { return consts.size() == 1 ? consts[0] : consts[k]; };
  // Updates the global elements [begin, end), slice by slice.
  auto run = [&](int64_t begin, int64_t end) {
    size_t j = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin()) - 1;
    for (; j < live.size() && starts[j] < end; ++j) {
      const int64_t lo = std::max(begin, starts[j]) - starts[j];
      const int64_t hi = std::min(end, starts[j + 1]) - starts[j];
      fn(consts_for(live[j]), slices[live[j]], lo, hi);
    }
  };
  const ThreadPool& tp = thread_pool();
  const int64_t pool = threads > 0 ? std::min<int64_t>(threads, tp.num_threads()) : tp.num_threads();
  const int64_t workers = std::max<int64_t>(1, std::min(pool, total / kMinPerWorker));
  if (workers == 1) return run(0, total);
  auto bound = [&](int64_t w) {
    return w == workers ? total : std::min(total, (total * w / workers) / kSplitAlign * kSplitAlign);
  };
  tp.run(workers, [&](int64_t w) { run(bound(w), bound(w + 1)); });
}

namespace {

// Without libtorus: one std::thread per worker beyond the calling thread.
int default_num_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }
void default_run(int64_t workers, const std::function<void(int64_t)>& fn) {
  std::vector<std::thread> extra;
  extra.reserve(static_cast<size_t>(workers - 1));
  for (int64_t w = 1; w < workers; ++w) extra.emplace_back([&fn, w] { fn(w); });
  fn(0);
  for (auto& t : extra) t.join();
}

std::atomic<const ThreadPool*> g_pool{nullptr};

}  // namespace

const ThreadPool& thread_pool() {
  static const ThreadPool fallback{default_num_threads, default_run};
  const ThreadPool* p = g_pool.load(std::memory_order_acquire);
  return p != nullptr ? *p : fallback;
}

void set_thread_pool(const ThreadPool* pool) { g_pool.store(pool, std::memory_order_release); }

}  // namespace torus::optim::cpu
