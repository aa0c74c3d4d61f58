#include "torus/optim/sgd.h"

#include <ATen/Functions.h>

#include <cmath>

#include "core/log.h"

namespace torus::optim {
namespace {

void check(const SGDOptions& o, const std::string& where) {
  TORUS_CHECK(std::isfinite(o.lr) && o.lr >= 0, InvalidArgument, "{}: lr must be >= 0, got {}", where, o.lr);
  TORUS_CHECK(std::isfinite(o.momentum) && o.momentum >= 0, InvalidArgument, "{}: momentum must be >= 0, got {}", where,
              o.momentum);
  TORUS_CHECK(o.dampening >= 0 && o.dampening <= 1, InvalidArgument, "{}: dampening must be in [0, 1], got {}", where,
              o.dampening);
  TORUS_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, InvalidArgument,
              "{}: weight decay must be >= 0, got {}", where, o.weight_decay);
  TORUS_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), InvalidArgument,
              "{}: Nesterov momentum needs momentum > 0 and dampening 0, got momentum {} and dampening {}", where,
              o.momentum, o.dampening);
}

const SGDOptions& checked(const SGDOptions& o) {
  check(o, "SGD");
  return o;
}

}  // namespace

void SGDOptions::validate() const {
  check(*this, "SGD");
}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options, OptimizerOptions common)
    : Optimizer("SGD", std::move(groups), checked(options).lr, options.weight_decay, common), options_(options) {
  for (size_t g = 0; g < num_groups(); ++g) {
    const ParamGroup& pg = this->groups()[g];
    TORUS_CHECK(!pg.beta1 && !pg.beta2 && !pg.eps, InvalidArgument,
                "SGD: group {} sets beta1, beta2 or eps, which SGD does not use", g);
    SGDOptions r = options_;
    r.momentum = pg.momentum.value_or(r.momentum);
    r.dampening = pg.dampening.value_or(r.dampening);
    r.nesterov = pg.nesterov.value_or(r.nesterov);
    r.weight_decay = weight_decay(g);
    check(r, fmt::format("SGD group {}", g));
    resolved_.push_back(r);
  }
}

std::vector<std::string> SGD::buffer_names(size_t g) const {
  if (resolved_.at(g).momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update(size_t g, double lr, Batch& b) {
  const SGDOptions& o = resolved_[g];
  // First update with momentum: the kernel sets the buffer to the gradient
  // (torch.optim.SGD's rule), whatever it held (zeros from init_state).
  at::_fused_sgd_(b.params, b.grads, o.momentum != 0 ? at::TensorList(b.buffers.at(0)) : at::TensorList(),
                  o.weight_decay, o.momentum, lr, o.dampening, o.nesterov, /*maximize=*/false, b.first_step);
}

void SGD::add_hyperparameters(size_t g, std::map<std::string, double>& out) const {
  const SGDOptions& o = resolved_.at(g);
  out["momentum"] = o.momentum;
  out["dampening"] = o.dampening;
  out["nesterov"] = o.nesterov ? 1.0 : 0.0;
}

}  // namespace torus::optim
