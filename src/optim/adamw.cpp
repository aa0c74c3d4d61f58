#include "torus/optim/adamw.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <set>
#include <tuple>

#include "core/log.h"

namespace torus::optim {

void AdamWOptions::validate() const {
  TORUS_CHECK(lr >= 0, InvalidArgument, "AdamW: lr must be >= 0, got {}", lr);
  TORUS_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, InvalidArgument,
              "AdamW: betas must be in [0, 1), got ({}, {})", beta1, beta2);
  TORUS_CHECK(eps > 0, InvalidArgument, "AdamW: eps must be > 0, got {}", eps);
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : options_(options), groups_(std::move(groups)) {
  options_.validate();
  std::set<const void*> seen;
  for (size_t g = 0; g < groups_.size(); ++g) {
    TORUS_CHECK(groups_[g].weight_decay >= 0, InvalidArgument, "AdamW: group {} has weight decay {} (must be >= 0)", g,
                groups_[g].weight_decay);
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const at::Tensor& p = groups_[g].params[i];
      TORUS_CHECK(p.defined(), InvalidArgument, "AdamW: parameter {} of group {} is undefined", i, g);
      TORUS_CHECK(seen.insert(p.unsafeGetTensorImpl()).second, InvalidArgument,
                  "AdamW: parameter {} of group {} is listed twice", i, g);
    }
    state_.emplace_back(groups_[g].params.size());
  }
}

int64_t AdamW::step_count(size_t g, size_t i) const {
  const State& s = state_.at(g).at(i);
  return s.step.defined() ? static_cast<int64_t>(s.step.item<float>()) : 0;
}

void AdamW::step(double lr) {
  const double rate = lr >= 0 ? lr : options_.lr;
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    // One fused call per (dtype, device) of the group's parameters.
    struct Batch {
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    };
    std::map<std::tuple<int, int, int>, Batch> batches;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      at::Tensor& p = groups_[g].params[i];
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      TORUS_CHECK(!grad.is_sparse(), Unsupported, "AdamW: sparse gradients are not supported");
      State& s = state_[g][i];
      if (!s.exp_avg.defined()) {
        s.exp_avg = at::zeros_like(p, at::MemoryFormat::Preserve);
        s.exp_avg_sq = at::zeros_like(p, at::MemoryFormat::Preserve);
        s.step = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(p.device()));
      }
      s.step.add_(1);
      const auto key = std::make_tuple(static_cast<int>(p.scalar_type()), static_cast<int>(p.device().type()),
                                       static_cast<int>(p.device().index()));
      Batch& b = batches[key];
      b.params.push_back(p);
      b.grads.push_back(grad);
      b.exp_avgs.push_back(s.exp_avg);
      b.exp_avg_sqs.push_back(s.exp_avg_sq);
      b.steps.push_back(s.step);
    }
    for (auto& [key, b] : batches) {
      at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, b.steps, rate,
                        options_.beta1, options_.beta2, groups_[g].weight_decay, options_.eps, /*amsgrad=*/false,
                        /*maximize=*/false);
    }
  }
}

void AdamW::zero_grad() {
  for (auto& group : groups_) {
    for (auto& p : group.params) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }
}

}  // namespace torus::optim
