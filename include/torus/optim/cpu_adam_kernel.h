// torus/optim/cpu_adam_kernel.h — the vectorised CPU Adam/AdamW kernel on
// raw buffers (no LibTorch): the update of fp32 master weights that ZeRO's
// CPU offload runs on the host, one pass over every array.
//
//   torus::optim::cpu::AdamHyper h{.lr = 3e-4, .weight_decay = 0.1, .decoupled = true, .step = t,
//                                  .grad_scale = 1.0f / loss_scale, .found_inf = &found_inf};
//   torus::optim::cpu::AdamSlice s{.param = master, .grad = grad_bf16, .grad_dtype = Dtype::kBF16,
//                                  .exp_avg = m, .exp_avg_sq = v, .param_out = param_bf16,
//                                  .out_dtype = Dtype::kBF16, .numel = n};
//   torus::optim::cpu::adam_update(h, s);           // every core of ATen's pool, the best ISA
//
// The update of element i (Note [CPU Adam order]) reads the fp32 parameter,
// the gradient (fp32, bf16 or f16), the fp32 exp_avg and exp_avg_sq, and
// writes the parameter, both moments and optionally `param_out`, the updated
// parameter rounded to nearest even into bf16 or f16 (or copied into f32):
// the write-back of master weights in the same pass.
//
// Note [CPU Adam order]: with every constant computed in double and rounded
// once to float (b1, 1 - b1, b2, 1 - b2, eps, wd, decay = 1 - lr wd,
// step_size = lr / (1 - b1^t), rbc2 = 1 / sqrt(1 - b2^t), grad_scale), each
// element is, in float arithmetic, in this order and without fused
// multiply-adds:
//   g = grad * grad_scale
//   AdamW (decoupled), wd != 0:  p = p * decay
//   Adam (L2),         wd != 0:  g = g + p * wd
//   m = m * b1 + g * (1 - b1)
//   v = v * b2 + (g * g) * (1 - b2)
//   p = p - (step_size * m) / (sqrt(v) * rbc2 + eps)
// which is torch.optim's p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// up to the rounding of these few operations. Every ISA path (scalar, AVX2,
// AVX-512) computes exactly this, bit for bit, for every element, whatever
// the alignment, the length, the tail and the thread count: results never
// depend on the path or on the threads (tests/optim/cpu_adam_test.cpp checks
// it against a scalar reference).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

namespace torus::optim::cpu {

// The instruction sets the kernel has a path for. kAuto: TORUS_CPU_ADAM_ISA
// when set (docs/params.md), else best_isa().
enum class Isa : uint8_t { kAuto, kScalar, kAvx2, kAvx512 };

// The fastest path this CPU runs: kAvx512 (AVX-512 F, BW, VL), kAvx2 (AVX2,
// FMA, F16C) or kScalar. Cheap (cached).
Isa best_isa();
// Can this CPU run `isa`'s path? (kAuto and kScalar: always.)
bool isa_supported(Isa isa);
// "auto", "scalar", "avx2", "avx512".
std::string_view isa_name(Isa isa);
// The inverse of isa_name; throws InvalidArgument for another string.
Isa parse_isa(std::string_view name);

enum class Dtype : uint8_t { kF32, kBF16, kF16 };

// The hyper-parameters of one update (Note [CPU Adam order]).
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;  // AdamW: p -= lr wd p first; false: Adam's L2, g += wd p
  int64_t step = 1;       // t, the 1-based count of this update (bias correction)
  // The gradient is multiplied by this before use: the inverse loss scale
  // times the clipping coefficient, folded into the one pass.
  float grad_scale = 1.0f;
  // Nullable. Non-null and *found_inf != 0 (read once, before any element):
  // the update is a no-op and writes nothing.
  const float* found_inf = nullptr;
};

// The arrays of one tensor; all have `numel` elements, any alignment, and
// must not overlap (except grad with nothing written).
struct AdamSlice {
  float* param = nullptr;  // fp32 (the master weights), updated in place
  const void* grad = nullptr;
  Dtype grad_dtype = Dtype::kF32;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  void* param_out = nullptr;  // nullable: receives the updated param in out_dtype
  Dtype out_dtype = Dtype::kBF16;
  int64_t numel = 0;
};

// One update of `slice`. threads: the most workers to use (0: ATen's
// intra-op thread count, at::get_num_threads(); never more than that pool
// has); small tensors run on the calling thread. isa: kAuto, or a path to
// force (Unsupported when the CPU lacks it). Blocks until done; thread safe
// for disjoint slices. Throws InvalidArgument for an invalid hyper-parameter
// (step < 1, betas outside [0, 1), eps <= 0, a negative lr or weight decay)
// or a null array with numel > 0.
void adam_update(const AdamHyper& hyper, const AdamSlice& slice, int threads = 0, Isa isa = Isa::kAuto);

// The same over many tensors in one parallel region (the elements of all of
// them are split evenly over the workers), e.g. the 100 small tensors of one
// parameter group: hypers has one entry for all slices or one per slice
// (each with its own step and found_inf).
void adam_update(std::span<const AdamHyper> hypers, std::span<const AdamSlice> slices, int threads = 0,
                 Isa isa = Isa::kAuto);

// The workers adam_update runs on. libtorus installs ATen's intra-op pool
// when it is loaded (so "0 threads" means at::get_num_threads(), as in every
// other LibTorch-facing layer); a program linking only the LibTorch-free
// layer (the Neuron host optimizer's tests) gets one std::thread per worker.
// run(workers, fn) calls fn(w) once for each w in [0, workers) and returns
// when all are done. The pool object must outlive every update.
struct ThreadPool {
  int (*num_threads)();
  void (*run)(int64_t workers, const std::function<void(int64_t)>& fn);
};
const ThreadPool& thread_pool();
void set_thread_pool(const ThreadPool* pool);

}  // namespace torus::optim::cpu
