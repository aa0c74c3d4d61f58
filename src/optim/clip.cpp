#include "torus/optim/clip.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "core/log.h"

namespace torus::optim {

ClipResult clip_grad_norm(const std::vector<GradNormEntry>& entries, double max_norm,
                          const comm::ProcessGroupPtr& group) {
  TORUS_CHECK(max_norm >= 0 && !std::isnan(max_norm), InvalidArgument,
              "clip_grad_norm: max_norm must be >= 0 (0: no clipping), got {}", max_norm);
  at::Tensor sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
  for (const auto& e : entries) {
    if (!e.counted || !e.param.defined()) continue;
    const at::Tensor& g = e.param.grad();
    if (!g.defined()) continue;
    sum += g.detach().to(at::kDouble).pow(2).sum();
  }
  if (group && group->size() > 1) group->all_reduce(sum)->wait();
  ClipResult r;
  r.norm = std::sqrt(sum.item<double>());
  r.finite = std::isfinite(r.norm);
  if (!r.finite || max_norm <= 0) return r;
  const double coef = max_norm / (r.norm + 1e-6);
  if (coef < 1.0) {
    r.coefficient = coef;
    for (const auto& e : entries) {
      if (!e.param.defined()) continue;
      at::Tensor g = e.param.grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return r;
}

}  // namespace torus::optim
