#include "torus/optim/clip.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "core/log.h"

namespace torus::optim {
namespace {

at::Tensor gradient_of(const GradNormEntry& e) {
  if (e.grad.defined()) return e.grad;
  return e.param.defined() ? e.param.grad() : at::Tensor();
}

// f64 wherever the device computes in it.
at::ScalarType accumulation_dtype(const at::Device& d) {
  return d.is_mps() ? at::kFloat : at::kDouble;
}

// Where the all-reduced sum lives: Note "Devices" in clip.h. The choice
// depends only on the group (and the gradients' device index), so every rank
// picks the same backend.
at::TensorOptions reduce_options(const comm::ProcessGroupPtr& group,
                                 const std::vector<std::pair<at::Device, at::Tensor>>& partials) {
  const comm::BackendPtr device = group ? group->device_backend() : nullptr;
  if (device && device->device_type() == DeviceType::kCUDA) {
    at::Device where(at::kCUDA);  // the current CUDA device, unless a gradient names one
    for (const auto& [d, sum] : partials) {
      if (d.is_cuda()) {
        where = d;
        break;
      }
    }
    const bool f64 = device->supports(comm::OpType::kAllReduce, DType::kF64, comm::ReduceOp::kSum);
    return at::TensorOptions().device(where).dtype(f64 ? at::kDouble : at::kFloat);
  }
  return at::TensorOptions().dtype(at::kDouble);
}

}  // namespace

ClipResult clip_grad_norm(const std::vector<GradNormEntry>& entries, double max_norm,
                          const comm::ProcessGroupPtr& group) {
  TORUS_CHECK(max_norm >= 0 && !std::isnan(max_norm), InvalidArgument,
              "clip_grad_norm: max_norm must be >= 0 (0: no clipping), got {}", max_norm);
  at::NoGradGuard no_grad;
  // Sum of squares per device, on that device.
  std::vector<std::pair<at::Device, at::Tensor>> partials;
  for (size_t k = 0; k < entries.size(); ++k) {
    const at::Tensor g = gradient_of(entries[k]);
    if (!g.defined()) continue;
    TORUS_CHECK(!g.is_sparse() && g.layout() == at::kStrided, InvalidArgument,
                "clip_grad_norm: the gradient of entry {} is sparse (not supported)", k);
    if (!entries[k].counted) continue;
    const at::Device d = g.device();
    const at::Tensor x = g.detach().to(accumulation_dtype(d)).reshape({-1});
    at::Tensor sq = at::dot(x, x);
    auto it = std::find_if(partials.begin(), partials.end(), [&](const auto& p) { return p.first == d; });
    if (it == partials.end()) {
      partials.emplace_back(d, sq);
    } else {
      it->second.add_(sq);
    }
  }
  at::Tensor sum = at::zeros({1}, reduce_options(group, partials));
  for (const auto& [d, s] : partials) sum.add_(s.to(sum.options()));
  if (group && group->size() > 1) group->all_reduce(sum)->wait();

  ClipResult r;
  r.norm = std::sqrt(sum.item<double>());
  r.finite = std::isfinite(r.norm);
  if (!r.finite || max_norm <= 0) return r;
  const double coef = max_norm / (r.norm + 1e-6);
  if (coef < 1.0) {
    r.coefficient = coef;
    std::set<const void*> scaled;
    for (const auto& e : entries) {
      at::Tensor g = gradient_of(e);
      if (g.defined() && scaled.insert(g.unsafeGetTensorImpl()).second) g.mul_(coef);
    }
  }
  return r;
}

}  // namespace torus::optim
