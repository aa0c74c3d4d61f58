// CpuAdam and CpuAdamW: the Optimizer seam over Torus's CPU Adam kernel, and
// the kernel's tensor-level entry points (argument checks, then raw pointers).
#include "torus/optim/cpu_adam.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cmath>
#include <optional>

#include "core/log.h"
#include "torus/comm/process_group.h"

namespace torus::optim {
namespace cpu {
namespace {

// The CPU Adam kernel's workers in libtorus: ATen's intra-op pool
// (cpu_adam_kernel.h, ThreadPool), installed when the library loads.
int aten_num_threads() { return at::get_num_threads(); }
void aten_run(int64_t workers, const std::function<void(int64_t)>& fn) {
  at::parallel_for(0, workers, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) fn(w);
  });
}
const ThreadPool kAtenPool{aten_num_threads, aten_run};
[[maybe_unused]] const bool kAtenPoolInstalled = (set_thread_pool(&kAtenPool), true);

std::optional<Dtype> dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return Dtype::kF32;
    case at::kBFloat16:
      return Dtype::kBF16;
    case at::kHalf:
      return Dtype::kF16;
    default:
      return std::nullopt;
  }
}

// Checks one tensor of an update: a contiguous CPU tensor of `numel`
// elements in one of the kernel's dtypes (f32 only unless any_dtype).
void check_arg(const at::Tensor& t, const char* what, size_t k, int64_t numel, bool any_dtype) {
  TORUS_CHECK(t.defined(), InvalidArgument, "CPU Adam: {} {} is undefined", what, k);
  TORUS_CHECK(t.device().is_cpu(), InvalidArgument, "CPU Adam: {} {} is on {} (CPU tensors only)", what, k,
              t.device().str());
  TORUS_CHECK(any_dtype ? dtype_of(t.scalar_type()).has_value() : t.scalar_type() == at::kFloat, InvalidArgument,
              "CPU Adam: {} {} is {} (expected {})", what, k, comm::scalar_type_name(t.scalar_type()),
              any_dtype ? "f32, bf16 or f16" : "f32");
  TORUS_CHECK(t.is_contiguous() && t.layout() == at::kStrided, InvalidArgument,
              "CPU Adam: {} {} is not a contiguous dense tensor", what, k);
  TORUS_CHECK(t.numel() == numel, InvalidArgument, "CPU Adam: {} {} has {} elements, its param {}", what, k,
              t.numel(), numel);
}

}  // namespace

void adam_update(const AdamHyper& hyper, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                 const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                 const std::vector<at::Tensor>& param_outs, int threads, Isa isa) {
  const size_t n = params.size();
  TORUS_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                  (param_outs.empty() || param_outs.size() == n),
              InvalidArgument, "CPU Adam: {} params, {} grads, {} exp_avgs, {} exp_avg_sqs, {} param_outs", n,
              grads.size(), exp_avgs.size(), exp_avg_sqs.size(), param_outs.size());
  std::vector<AdamSlice> slices(n);
  for (size_t k = 0; k < n; ++k) {
    TORUS_CHECK(params[k].defined(), InvalidArgument, "CPU Adam: param {} is undefined", k);
    const int64_t numel = params[k].numel();
    check_arg(params[k], "param", k, numel, false);
    check_arg(grads[k], "grad", k, numel, true);
    check_arg(exp_avgs[k], "exp_avg", k, numel, false);
    check_arg(exp_avg_sqs[k], "exp_avg_sq", k, numel, false);
    const at::Tensor* out = param_outs.empty() || !param_outs[k].defined() ? nullptr : &param_outs[k];
    if (out) check_arg(*out, "param_out", k, numel, true);
    // Nothing written may overlap anything else (the gradient included).
    const at::Tensor* all[] = {&params[k], &exp_avgs[k], &exp_avg_sqs[k], out, &grads[k]};
    const char* names[] = {"param", "exp_avg", "exp_avg_sq", "param_out", "grad"};
    for (int a = 0; a < 4; ++a) {
      for (int b = a + 1; b < 5; ++b) {
        if (!all[a] || !all[b] || numel == 0) continue;
        TORUS_CHECK(at::get_overlap_status(*all[a], *all[b]) == at::MemOverlapStatus::No, InvalidArgument,
                    "CPU Adam: {} {} and {} {} share memory", names[a], k, names[b], k);
      }
    }
    slices[k] = AdamSlice{.param = params[k].data_ptr<float>(),
                          .grad = grads[k].data_ptr(),
                          .grad_dtype = *dtype_of(grads[k].scalar_type()),
                          .exp_avg = exp_avgs[k].data_ptr<float>(),
                          .exp_avg_sq = exp_avg_sqs[k].data_ptr<float>(),
                          .param_out = out ? out->data_ptr() : nullptr,
                          .out_dtype = out ? *dtype_of(out->scalar_type()) : Dtype::kBF16,
                          .numel = numel};
  }
  adam_update(std::span<const AdamHyper>(&hyper, 1), slices, threads, isa);
}

void adam_update(const AdamHyper& hyper, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                 const at::Tensor& exp_avg_sq, const at::Tensor& param_out, int threads, Isa isa) {
  adam_update(hyper, std::vector<at::Tensor>{param}, {grad}, {exp_avg}, {exp_avg_sq},
              param_out.defined() ? std::vector<at::Tensor>{param_out} : std::vector<at::Tensor>{}, threads, isa);
}

}  // namespace cpu

namespace detail {

CpuAdamBase::CpuAdamBase(std::string_view who, bool decoupled, std::vector<ParamGroup> groups, AdamOptions options,
                         OptimizerOptions common, CpuAdamOptions cpu)
    : Optimizer(who, std::move(groups), options.lr, options.weight_decay, common,
                decoupled ? "cpu_adamw" : "cpu_adam"),
      decoupled_(decoupled),
      options_(options),
      cpu_(cpu) {
  TORUS_CHECK(cpu_.threads >= 0, InvalidArgument, "{}: threads must be >= 0, got {}", who, cpu_.threads);
  for (size_t g = 0; g < num_groups(); ++g) {
    const ParamGroup& pg = this->groups()[g];
    resolved_.push_back(resolve_adam_group(options_, pg, weight_decay(g), who, g));
    for (size_t i = 0; i < pg.params.size(); ++i) {
      const at::Tensor& p = pg.params[i];
      TORUS_CHECK(p.device().is_cpu(), InvalidArgument, "{}: parameter '{}' is on {} (CPU parameters only)", who,
                  param_name(g, i), p.device().str());
      TORUS_CHECK(p.is_contiguous(), InvalidArgument, "{}: parameter '{}' is not contiguous", who, param_name(g, i));
      const bool f32 = p.scalar_type() == at::kFloat;
      const bool half = p.scalar_type() == at::kHalf || p.scalar_type() == at::kBFloat16;
      TORUS_CHECK(f32 || (half && has_master(g, i)), InvalidArgument,
                  "{}: parameter '{}' is {}; the CPU kernel updates f32 values: f32 parameters, or f16/bf16 ones "
                  "with fp32 master weights",
                  who, param_name(g, i), comm::scalar_type_name(p.scalar_type()));
    }
  }
}

std::vector<std::string> CpuAdamBase::buffer_names(size_t) const {
  return {"exp_avg", "exp_avg_sq"};
}

void CpuAdamBase::set_grad_scale(double grad_scale, at::Tensor found_inf) {
  TORUS_CHECK(std::isfinite(grad_scale) && grad_scale > 0, InvalidArgument,
              "{}: grad_scale must be finite and > 0, got {}", who(), grad_scale);
  if (found_inf.defined()) {
    TORUS_CHECK(found_inf.device().is_cpu() && found_inf.scalar_type() == at::kFloat && found_inf.numel() == 1,
                InvalidArgument, "{}: found_inf must be a one-element f32 CPU tensor, got {} {} with {} elements",
                who(), found_inf.device().str(), comm::scalar_type_name(found_inf.scalar_type()), found_inf.numel());
  }
  grad_scale_ = grad_scale;
  found_inf_ = std::move(found_inf);
}

bool CpuAdamBase::skip_step() const {
  return found_inf_.defined() && found_inf_.item<float>() != 0.0f;
}

void CpuAdamBase::update(size_t g, double lr, Batch& b) {
  const AdamOptions& o = resolved_[g];
  std::vector<at::Tensor> grads(b.grads.size());
  for (size_t j = 0; j < grads.size(); ++j) {
    const at::Tensor& grad = b.grads[j];
    grads[j] = cpu::dtype_of(grad.scalar_type()) ? grad.contiguous() : grad.to(at::kFloat).contiguous();
  }
  // One kernel call for the whole batch; the steps may differ per parameter.
  std::vector<cpu::AdamHyper> hypers;
  std::vector<cpu::AdamSlice> slices;
  hypers.reserve(grads.size());
  slices.reserve(grads.size());
  for (size_t j = 0; j < grads.size(); ++j) {
    hypers.push_back({.lr = lr,
                      .beta1 = o.beta1,
                      .beta2 = o.beta2,
                      .eps = o.eps,
                      .weight_decay = o.weight_decay,
                      .decoupled = decoupled_,
                      .step = static_cast<int64_t>(b.steps[j].item<float>()),
                      .grad_scale = static_cast<float>(grad_scale_)});
    const at::Tensor& out = b.outputs.empty() ? at::Tensor() : b.outputs[j];
    slices.push_back({.param = b.params[j].data_ptr<float>(),
                      .grad = grads[j].data_ptr(),
                      .grad_dtype = *cpu::dtype_of(grads[j].scalar_type()),
                      .exp_avg = b.buffers[0][j].data_ptr<float>(),
                      .exp_avg_sq = b.buffers[1][j].data_ptr<float>(),
                      .param_out = out.defined() ? out.data_ptr() : nullptr,
                      .out_dtype = out.defined() ? *cpu::dtype_of(out.scalar_type()) : cpu::Dtype::kBF16,
                      .numel = b.params[j].numel()});
  }
  cpu::adam_update(hypers, slices, cpu_.threads, cpu_.isa);
}

void CpuAdamBase::add_hyperparameters(size_t g, std::map<std::string, double>& out) const {
  const AdamOptions& o = resolved_.at(g);
  out["beta1"] = o.beta1;
  out["beta2"] = o.beta2;
  out["eps"] = o.eps;
}

}  // namespace detail

CpuAdam::CpuAdam(std::vector<ParamGroup> groups, AdamOptions options, OptimizerOptions common, CpuAdamOptions cpu)
    : CpuAdamBase("CpuAdam", /*decoupled=*/false, std::move(groups), options, common, cpu) {}

CpuAdamW::CpuAdamW(std::vector<ParamGroup> groups, AdamWOptions options, OptimizerOptions common,
                   CpuAdamOptions cpu)
    : CpuAdamBase("CpuAdamW", /*decoupled=*/true, std::move(groups), options, common, cpu) {}

}  // namespace torus::optim
