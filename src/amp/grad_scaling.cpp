#include "torus/amp/grad_scaling.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "core/log.h"

namespace torus::amp {
namespace {

// "cuda" (no index) matches any CUDA device.
bool same_device(const c10::Device& a, const c10::Device& b) {
  return a.type() == b.type() && (!a.has_index() || !b.has_index() || a.index() == b.index());
}

}  // namespace

bool found_non_finite(const std::vector<at::Tensor>& grads, const std::vector<comm::ProcessGroupPtr>& groups,
                      std::optional<c10::Device> flag_device) {
  std::vector<at::Tensor> bad;  // one 0-d bool per gradient, on its device
  bad.reserve(grads.size());
  for (const at::Tensor& g : grads) {
    if (!g.defined()) continue;
    TORUS_CHECK(at::isFloatingType(g.scalar_type()), InvalidArgument,
                "found_non_finite: gradients must be floating point, got {}", c10::toString(g.scalar_type()));
    if (!flag_device) flag_device = g.device();
    TORUS_CHECK(same_device(g.device(), *flag_device), InvalidArgument,
                "found_non_finite: gradients on {} and {}; the flag needs one device (check them per device)",
                flag_device->str(), g.device().str());
    if (!flag_device->has_index()) flag_device = g.device();
    bad.push_back(at::isfinite(g).all().logical_not());
  }
  const auto options = at::TensorOptions().dtype(at::kFloat).device(flag_device.value_or(c10::Device(c10::kCPU)));
  // No synchronisation until the one read at the end.
  at::Tensor flag = bad.empty() ? at::zeros({1}, options) : at::stack(bad).any().to(options).reshape({1});
  for (const auto& g : groups) {
    if (g && g->size() > 1) g->all_reduce(flag, {.op = comm::ReduceOp::kMax})->wait();
  }
  return flag.item<float>() > 0;
}

bool found_non_finite(const std::vector<at::Tensor>& grads, const comm::ProcessGroupPtr& group,
                      std::optional<c10::Device> flag_device) {
  return found_non_finite(grads, std::vector<comm::ProcessGroupPtr>{group}, flag_device);
}

void unscale_(const std::vector<at::Tensor>& grads, double inv_scale) {
  TORUS_CHECK(std::isfinite(inv_scale) && inv_scale > 0, InvalidArgument,
              "unscale_: inv_scale must be finite and > 0, got {}", inv_scale);
  if (inv_scale == 1.0) return;
  for (const at::Tensor& g : grads) {
    if (!g.defined()) continue;
    if (g.scalar_type() == at::kHalf || g.scalar_type() == at::kBFloat16) {
      // Upcast: ATen's CPU kernels round a scalar factor to f16 on some
      // paths (the tail of a vectorised loop, _foreach_mul_), which would
      // round a factor like 1/3 twice.
      g.copy_(g.to(at::kFloat).mul_(inv_scale));
    } else {
      g.mul_(inv_scale);
    }
  }
}

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (const at::Tensor& p : params) out.push_back(p.defined() ? p.grad() : at::Tensor());
  return out;
}

}  // namespace torus::amp
