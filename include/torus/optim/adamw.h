// torus/optim/adamw.h — AdamW with one fused, vectorised kernel per step.
//
//   torus::optim::AdamW opt({{decay_params, 0.1}, {no_decay_params, 0.0}}, {.lr = 3e-4, .beta2 = 0.95});
//   loss.backward(); opt.step(); opt.zero_grad();
//
// The update is PyTorch's AdamW (decoupled weight decay, bias correction,
// eps outside the square root): p -= lr * wd * p; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
// Each step makes one pass over every parameter, gradient and state tensor
// through ATen's fused multi-tensor AdamW kernel (vectorised on CPU, one
// kernel per group on CUDA), where torch::optim::AdamW runs about ten
// element-wise passes per parameter. State is created on a parameter's first
// step with a gradient, in the parameter's dtype and device; parameters
// without a gradient are skipped (their step count does not advance).
//
// Thread safety: none (one step at a time, like any optimizer).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace torus::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // Throws InvalidArgument for lr < 0, betas outside [0, 1), eps <= 0.
  void validate() const;
};

struct ParamGroup {
  std::vector<at::Tensor> params;  // leaves; each at most once over all groups
  double weight_decay = 0.0;
};

class AdamW {
 public:
  // Throws InvalidArgument for bad options, a negative weight decay, an
  // undefined parameter or one listed twice.
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options);

  // One update of every parameter that has a gradient. lr < 0: options().lr.
  // Parameters are grouped by (dtype, device) within each group for the
  // fused kernel.
  void step(double lr = -1.0);
  // Zeroes the gradients in place (keeps their storage: the DP buckets own it).
  void zero_grad();

  const AdamWOptions& options() const { return options_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // State of parameter i of group g (undefined before its first step).
  const at::Tensor& exp_avg(size_t g, size_t i) const { return state_.at(g).at(i).exp_avg; }
  const at::Tensor& exp_avg_sq(size_t g, size_t i) const { return state_.at(g).at(i).exp_avg_sq; }
  int64_t step_count(size_t g, size_t i) const;

 private:
  struct State {
    at::Tensor exp_avg, exp_avg_sq, step;  // step: a 1-element f32 tensor (the kernel's convention)
  };
  AdamWOptions options_;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<State>> state_;
};

}  // namespace torus::optim
