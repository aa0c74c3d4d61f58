// torus/optim/cpu_adam.h — Adam and AdamW on the CPU through Torus's own
// vectorised kernel (cpu_adam_kernel.h): the tensor-level call and the
// Optimizer implementations "cpu_adam" and "cpu_adamw" (make_optimizer).
//
//   torus::optim::CpuAdamW opt({{decay, 0.1}, {no_decay, 0.0}}, {.lr = 3e-4, .beta2 = 0.95});
//   opt.set_grad_scale(1.0 / loss_scale * clip_coef, found_inf);   // folded into the kernel's one pass
//   opt.step();
//
// The same contract as AdamW / Adam (adamw.h, optimizer.h: groups, lazy
// state "exp_avg", "exp_avg_sq", "step", master weights, grad provider,
// state_dict), and the same formulas up to the rounding of a few operations
// per element (Note [CPU Adam order]); what differs:
//  * Parameters must be dense, contiguous CPU tensors that are updated in
//    fp32: f32 parameters, or f16/bf16 ones with fp32 masters (the default
//    MasterWeights::kHalf; kNever is rejected for them). f64 is rejected.
//  * The gradient of a parameter with a master may be f32, bf16 or f16 (read
//    as it is, without an upcast copy; f64 is converted); non-contiguous
//    gradients are copied first.
//  * The write-back of a master into its f16/bf16 (or, with kAlways, f32)
//    parameter happens inside the kernel's pass (round to nearest even).
//  * set_grad_scale: every gradient is multiplied by a scale in the kernel,
//    and a found_inf flag makes step() a skipped step (nothing changes, not
//    even the counts), read once at the start of step().
//  * Each group's parameters are updated by one parallel call over ATen's
//    intra-op pool (CpuAdamOptions::threads), with the ISA path of
//    CpuAdamOptions::isa.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "torus/optim/adamw.h"
#include "torus/optim/cpu_adam_kernel.h"

namespace torus::optim {

namespace cpu {

// The kernel on tensors: one update of `param` (f32) with `grad` (f32, bf16
// or f16), `exp_avg` and `exp_avg_sq` (f32), and optionally `param_out`
// (f32, bf16 or f16; undefined: none), all contiguous CPU tensors with
// param's number of elements. Throws InvalidArgument naming the argument
// that does not fit (device, dtype, size, contiguity, overlap with param),
// and what adam_update throws; nothing is written then.
void adam_update(const AdamHyper& hyper, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                 const at::Tensor& exp_avg_sq, const at::Tensor& param_out = {}, int threads = 0,
                 Isa isa = Isa::kAuto);

// The same for lists of tensors in one parallel region (param_outs empty, or
// one per param with undefined entries for none).
void adam_update(const AdamHyper& hyper, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                 const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                 const std::vector<at::Tensor>& param_outs = {}, int threads = 0, Isa isa = Isa::kAuto);

}  // namespace cpu

struct CpuAdamOptions {
  int threads = 0;               // the most workers per group (0: at::get_num_threads())
  cpu::Isa isa = cpu::Isa::kAuto;  // kAuto: TORUS_CPU_ADAM_ISA, else the best the CPU has
};

namespace detail {

class CpuAdamBase : public Optimizer {
 public:
  const AdamOptions& options() const { return options_; }
  const CpuAdamOptions& cpu_options() const { return cpu_; }
  std::vector<std::string> buffer_names(size_t g) const override;

  // Until changed: every gradient is multiplied by `grad_scale` (finite, > 0;
  // e.g. 1 / loss scale x the clipping coefficient) inside the update, and
  // when `found_inf` is defined (a one-element f32 CPU tensor, kept and read
  // at the start of each step()) and non-zero, step() changes nothing and
  // counts nothing, like a step that was not taken. set_grad_scale(1.0)
  // restores the plain update. Throws InvalidArgument for a bad value.
  void set_grad_scale(double grad_scale, at::Tensor found_inf = {});
  double grad_scale() const { return grad_scale_; }

 protected:
  CpuAdamBase(std::string_view who, bool decoupled, std::vector<ParamGroup> groups, AdamOptions options,
              OptimizerOptions common, CpuAdamOptions cpu);
  void update(size_t g, double lr, Batch& batch) override;
  void add_hyperparameters(size_t g, std::map<std::string, double>& out) const override;
  bool skip_step() const override;
  bool reads_half_gradients() const override { return true; }
  bool fuses_master_write_back() const override { return true; }

 private:
  bool decoupled_;
  AdamOptions options_;
  CpuAdamOptions cpu_;
  std::vector<AdamOptions> resolved_;  // per group, overrides applied
  double grad_scale_ = 1.0;
  at::Tensor found_inf_;
};

}  // namespace detail

// Adam (L2 weight decay, as torch.optim.Adam) on the CPU kernel; name "cpu_adam".
class CpuAdam final : public detail::CpuAdamBase {
 public:
  // Throws InvalidArgument for bad options, a group that sets momentum,
  // dampening or nesterov, a parameter that is not a contiguous CPU tensor
  // updated in fp32, and what Optimizer rejects.
  CpuAdam(std::vector<ParamGroup> groups, AdamOptions options = {}, OptimizerOptions common = {},
          CpuAdamOptions cpu = {});
};

// AdamW (decoupled weight decay, as torch.optim.AdamW) on the CPU kernel; name "cpu_adamw".
class CpuAdamW final : public detail::CpuAdamBase {
 public:
  // Throws as CpuAdam.
  CpuAdamW(std::vector<ParamGroup> groups, AdamWOptions options = {}, OptimizerOptions common = {},
           CpuAdamOptions cpu = {});
};

}  // namespace torus::optim
