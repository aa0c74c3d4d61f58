// torus/optim/sgd.h — stochastic gradient descent with momentum, as torch.optim.SGD.
//
//   torus::optim::SGD opt({{params}}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
//
// The update of a parameter p with gradient g at group learning rate lr
// (weight decay wd is L2: added to the gradient):
//   g = g + wd p
//   momentum > 0:  b = g at the parameter's first update, else b = momentum b + (1 - dampening) g
//                  g = nesterov ? g + momentum b : b
//   p = p - lr g
// One at::_fused_sgd_ call per group, dtype, device and first-step flag. The
// state is "momentum_buffer" (none when the group's momentum is 0) and
// "step"; the contract of optimizer.h holds.
#pragma once

#include "torus/optim/optimizer.h"

namespace torus::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;  // of groups that do not set their own
  // Throws InvalidArgument for lr, momentum or weight decay < 0 (or not
  // finite), dampening outside [0, 1], and nesterov without momentum > 0 and
  // dampening 0 (torch.optim's rule).
  void validate() const;
};

class SGD final : public Optimizer {
 public:
  // Throws InvalidArgument for bad options (also after a group's overrides),
  // a group that sets betas or eps, and what Optimizer rejects.
  SGD(std::vector<ParamGroup> groups, SGDOptions options = {}, OptimizerOptions common = {});

  const SGDOptions& options() const { return options_; }
  std::vector<std::string> buffer_names(size_t g) const override;

 protected:
  void update(size_t g, double lr, Batch& batch) override;
  void add_hyperparameters(size_t g, std::map<std::string, double>& out) const override;

 private:
  SGDOptions options_;
  std::vector<SGDOptions> resolved_;  // per group, overrides applied
};

}  // namespace torus::optim
