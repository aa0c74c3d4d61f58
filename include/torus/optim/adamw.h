// torus/optim/adamw.h — AdamW (decoupled weight decay), as torch.optim.AdamW.
//
//   torus::optim::AdamW opt({{decay_params, 0.1}, {no_decay_params, 0.0}}, {.lr = 3e-4, .beta2 = 0.95});
//   loss.backward(); opt.step(); opt.zero_grad();
//
// The update of a parameter p with gradient g at group learning rate lr and
// its t-th update (bias correction, eps outside the square root):
//   p = p - lr wd p
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// Each step makes one pass over every parameter, gradient and state tensor
// through ATen's fused multi-tensor AdamW kernel (vectorised on the CPU, one
// kernel per group, dtype and device on CUDA), where torch::optim::AdamW runs
// about ten element-wise passes per parameter. The state is "exp_avg" (m),
// "exp_avg_sq" (v) and "step" (t); the contract of optimizer.h holds (groups,
// lazy state, skipped parameters, master weights, grad provider, state_dict).
//
// fp32 master weights and a grad provider, e.g. bf16 parameters whose fp32
// main gradients a gradient-sync component keeps:
//   torus::optim::AdamW opt(std::move(groups), {.lr = 3e-4});    // bf16 params: fp32 masters by default
//   opt.set_grad_provider([&](const at::Tensor& p) { return sync.main_grad(p); });
#pragma once

#include "torus/optim/adam.h"

namespace torus::optim {

// The same options as Adam; weight_decay is the decoupled rate.
using AdamWOptions = AdamOptions;

class AdamW final : public detail::AdamBase {
 public:
  // Throws InvalidArgument for bad options (also after a group's overrides),
  // a group that sets momentum, dampening or nesterov, and what Optimizer
  // rejects (an undefined parameter, one listed twice, a negative weight decay...).
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {}, OptimizerOptions common = {});
};

}  // namespace torus::optim
