#include "torus/parallel/tensor/weight_grad.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "core/log.h"
#include "torus/parallel/backward_callback.h"

namespace torus::tp {
namespace {

thread_local bool t_defer = false;
thread_local WeightGradStore* t_store = nullptr;

// Weight and bias gradients of one linear from its input and output gradient
// (leading dimensions flattened). Note [Linear compute dtype]: the matmuls run
// in the output gradient's dtype — the dtype the forward computed in, which
// under autocast differs from the fp32 parameters and input — and each
// gradient is returned in its tensor's own dtype.
std::pair<at::Tensor, at::Tensor> weight_grads(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& x,
                                               const at::Tensor& dy) {
  const int64_t out = weight.size(0), in = weight.size(1);
  at::Tensor dy2 = dy.reshape({-1, out});
  at::Tensor dw = at::mm(dy2.t(), x.reshape({-1, in}).to(dy.scalar_type())).to(weight.scalar_type());
  at::Tensor db = bias.defined() ? dy2.sum(0).to(bias.scalar_type()) : at::Tensor();
  return {dw, db};
}

void accumulate(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  if (!params.empty()) torch::autograd::backward(params, grads);
}

// The leaves of a deferring linear: passed as a non-tensor argument so that
// the node has no graph edge to them (their gradients never flow through the
// engine from here; the store accumulates them later).
struct Leaves {
  at::Tensor weight, bias;
};

// The autograd node of a deferring linear: its backward computes dx only.
struct DeferredLinear : torch::autograd::Function<DeferredLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, Leaves leaves) {
    ctx->save_for_backward({x});
    ctx->saved_data["weight"] = leaves.weight;
    ctx->saved_data["has_bias"] = leaves.bias.defined();
    if (leaves.bias.defined()) ctx->saved_data["bias"] = leaves.bias;
    return at::linear(x, leaves.weight.detach(),
                      leaves.bias.defined() ? std::optional<at::Tensor>(leaves.bias.detach()) : std::nullopt);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    const at::Tensor bias = ctx->saved_data["has_bias"].toBool() ? ctx->saved_data["bias"].toTensor() : at::Tensor();
    const at::Tensor& dy = grads[0];
    // Note [Linear compute dtype].
    at::Tensor dx = at::matmul(dy, weight.detach().to(dy.scalar_type())).to(x.scalar_type());
    if (t_store != nullptr) {
      t_store->push(weight, bias, x, dy);
    } else {
      auto [dw, db] = weight_grads(weight, bias, x, dy);
      std::vector<at::Tensor> params{weight}, gs{dw};
      if (bias.defined() && bias.requires_grad()) {
        params.push_back(bias);
        gs.push_back(db);
      }
      // A backward inside this node's backward (Note [Inner backward]).
      parallel::InnerBackwardScope inner;
      accumulate(params, gs);
    }
    return {dx, at::Tensor()};
  }
};

}  // namespace

void WeightGradStore::push(at::Tensor weight, at::Tensor bias, at::Tensor input, at::Tensor grad_output) {
  entries_.push_back({std::move(weight), std::move(bias), std::move(input), std::move(grad_output)});
}

void WeightGradStore::flush() {
  if (entries_.empty()) return;
  std::vector<at::Tensor> params, grads;
  params.reserve(2 * entries_.size());
  grads.reserve(2 * entries_.size());
  {
    at::NoGradGuard no_grad;
    for (const Entry& e : entries_) {
      auto [dw, db] = weight_grads(e.weight, e.bias, e.input, e.grad_output);
      params.push_back(e.weight);
      grads.push_back(dw);
      if (e.bias.defined() && e.bias.requires_grad()) {
        params.push_back(e.bias);
        grads.push_back(db);
      }
    }
  }
  entries_.clear();
  accumulate(params, grads);
}

DeferWeightGradGuard::DeferWeightGradGuard(bool enabled) : previous_(t_defer) { t_defer = enabled; }
DeferWeightGradGuard::~DeferWeightGradGuard() { t_defer = previous_; }
bool weight_grad_deferral_enabled() { return t_defer; }

WeightGradStoreGuard::WeightGradStoreGuard(WeightGradStore* store) : previous_(t_store) { t_store = store; }
WeightGradStoreGuard::~WeightGradStoreGuard() { t_store = previous_; }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (t_defer && weight.requires_grad() && x.requires_grad() && at::GradMode::is_enabled()) {
    return DeferredLinear::apply(x, Leaves{weight, bias});
  }
  return at::linear(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

}  // namespace torus::tp
