// Adam and AdamW: one implementation (detail::AdamBase), two fused kernels.
#include "torus/optim/adam.h"

#include <ATen/Functions.h>

#include <cmath>

#include "core/log.h"
#include "torus/optim/adamw.h"

namespace torus::optim {
namespace {

void check(const AdamOptions& o, const std::string& where) {
  TORUS_CHECK(std::isfinite(o.lr) && o.lr >= 0, InvalidArgument, "{}: lr must be >= 0, got {}", where, o.lr);
  TORUS_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, InvalidArgument,
              "{}: betas must be in [0, 1), got ({}, {})", where, o.beta1, o.beta2);
  TORUS_CHECK(std::isfinite(o.eps) && o.eps > 0, InvalidArgument, "{}: eps must be > 0, got {}", where, o.eps);
  TORUS_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, InvalidArgument,
              "{}: weight decay must be >= 0, got {}", where, o.weight_decay);
}

const AdamOptions& checked(const AdamOptions& o, std::string_view who) {
  check(o, std::string(who));
  return o;
}

}  // namespace

void AdamOptions::validate() const {
  check(*this, "Adam");
}

namespace detail {

AdamOptions resolve_adam_group(const AdamOptions& base, const ParamGroup& pg, double weight_decay,
                               std::string_view who, size_t g) {
  TORUS_CHECK(!pg.momentum && !pg.dampening && !pg.nesterov, InvalidArgument,
              "{}: group {} sets momentum, dampening or nesterov, which {} does not use", who, g, who);
  AdamOptions r = base;
  r.beta1 = pg.beta1.value_or(r.beta1);
  r.beta2 = pg.beta2.value_or(r.beta2);
  r.eps = pg.eps.value_or(r.eps);
  r.weight_decay = weight_decay;
  check(r, fmt::format("{} group {}", who, g));
  return r;
}

AdamBase::AdamBase(std::string_view who, bool decoupled, std::vector<ParamGroup> groups, AdamOptions options,
                   OptimizerOptions common)
    : Optimizer(who, std::move(groups), checked(options, who).lr, options.weight_decay, common),
      decoupled_(decoupled),
      options_(options) {
  for (size_t g = 0; g < num_groups(); ++g) {
    resolved_.push_back(resolve_adam_group(options_, this->groups()[g], weight_decay(g), who, g));
  }
}

std::vector<std::string> AdamBase::buffer_names(size_t) const {
  return {"exp_avg", "exp_avg_sq"};
}

void AdamBase::update(size_t g, double lr, Batch& b) {
  const AdamOptions& o = resolved_[g];
  if (decoupled_) {
    at::_fused_adamw_(b.params, b.grads, b.buffers.at(0), b.buffers.at(1), /*max_exp_avg_sqs=*/{}, b.steps, lr, o.beta1,
                      o.beta2, o.weight_decay, o.eps, /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(b.params, b.grads, b.buffers.at(0), b.buffers.at(1), /*max_exp_avg_sqs=*/{}, b.steps, lr, o.beta1,
                     o.beta2, o.weight_decay, o.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

void AdamBase::add_hyperparameters(size_t g, std::map<std::string, double>& out) const {
  const AdamOptions& o = resolved_.at(g);
  out["beta1"] = o.beta1;
  out["beta2"] = o.beta2;
  out["eps"] = o.eps;
}

}  // namespace detail

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options, OptimizerOptions common)
    : AdamBase("Adam", /*decoupled=*/false, std::move(groups), options, common) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options, OptimizerOptions common)
    : AdamBase("AdamW", /*decoupled=*/true, std::move(groups), options, common) {}

}  // namespace torus::optim
