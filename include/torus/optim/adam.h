// torus/optim/adam.h — Adam with L2 weight decay, as torch.optim.Adam (and
// the options and implementation AdamW shares, adamw.h).
//
//   torus::optim::Adam opt({{params, 1e-4}}, {.lr = 1e-3, .beta2 = 0.95});
//
// The update of a parameter p with gradient g at group learning rate lr and
// its t-th update (weight decay wd is L2: added to the gradient):
//   g = g + wd p
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// One at::_fused_adam_ call per group, dtype and device (one pass over every
// parameter, gradient and state tensor; vectorised on the CPU). The state is
// "exp_avg" (m), "exp_avg_sq" (v) and "step" (t); the contract of
// optimizer.h holds.
#pragma once

#include "torus/optim/optimizer.h"

namespace torus::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // of groups that do not set their own
  // Throws InvalidArgument for lr < 0, betas outside [0, 1), eps <= 0,
  // weight decay < 0 (or any of them not finite).
  void validate() const;
};

namespace detail {

// The options of group `g` of an Adam-family optimizer: `base` with the
// group's overrides (betas, eps) and its resolved weight decay. Throws
// InvalidArgument naming `who` and the group when the group sets an SGD
// option or a value is out of range.
AdamOptions resolve_adam_group(const AdamOptions& base, const ParamGroup& group, double weight_decay,
                               std::string_view who, size_t g);

// Adam and AdamW differ only in how the weight decay enters.
class AdamBase : public Optimizer {
 public:
  const AdamOptions& options() const { return options_; }
  std::vector<std::string> buffer_names(size_t g) const override;

 protected:
  // decoupled: AdamW's p = p - lr wd p before the Adam step, instead of g + wd p.
  AdamBase(std::string_view who, bool decoupled, std::vector<ParamGroup> groups, AdamOptions options,
           OptimizerOptions common);
  void update(size_t g, double lr, Batch& batch) override;
  void add_hyperparameters(size_t g, std::map<std::string, double>& out) const override;

 private:
  bool decoupled_;
  AdamOptions options_;
  std::vector<AdamOptions> resolved_;  // per group, overrides applied
};

}  // namespace detail

class Adam final : public detail::AdamBase {
 public:
  // Throws InvalidArgument for bad options (also after a group's overrides),
  // a group that sets momentum, dampening or nesterov, and what Optimizer
  // rejects.
  Adam(std::vector<ParamGroup> groups, AdamOptions options = {}, OptimizerOptions common = {});
};

}  // namespace torus::optim
