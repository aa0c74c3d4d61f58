// CPU reference for the AdamW step (kernels/ref/adamw_ref.h).
#include "kernels/ref/adamw_ref.h"

#include <cmath>
#include <cstdint>

#include "core/log.h"
#include "kernels/ref/half.h"

namespace torus::kernels {

AdamWScalars adamw_scalars(const AdamWConfig& c) {
  TORUS_CHECK(c.step >= 1, InvalidArgument, "adamw: step must be >= 1, got {}", c.step);
  TORUS_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1, InvalidArgument,
              "adamw: betas must be in [0, 1), got ({}, {})", c.beta1, c.beta2);
  TORUS_CHECK(c.lr >= 0 && std::isfinite(c.lr), InvalidArgument, "adamw: lr must be finite and >= 0, got {}", c.lr);
  TORUS_CHECK(c.eps > 0, InvalidArgument, "adamw: eps must be > 0, got {}", c.eps);
  TORUS_CHECK(c.weight_decay >= 0 && std::isfinite(c.weight_decay), InvalidArgument,
              "adamw: weight_decay must be finite and >= 0, got {}", c.weight_decay);
  TORUS_CHECK(std::isfinite(c.inv_grad_scale), InvalidArgument, "adamw: inv_grad_scale must be finite, got {}",
              c.inv_grad_scale);
  double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(c.step));
  double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(c.step));
  AdamWScalars s;
  s.beta1 = c.beta1;
  s.beta2 = c.beta2;
  s.one_minus_beta1 = 1.0f - c.beta1;
  s.one_minus_beta2 = 1.0f - c.beta2;
  s.eps = c.eps;
  s.decay = static_cast<float>(1.0 - static_cast<double>(c.lr) * c.weight_decay);
  s.step_size = static_cast<float>(c.lr / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.inv_grad_scale = c.inv_grad_scale;
  return s;
}

bool adamw_check(std::span<const AdamWTensor> tensors, DType grad_dtype, DType model_dtype) {
  TORUS_CHECK(grad_dtype == DType::kF32 || grad_dtype == DType::kBF16 || grad_dtype == DType::kF16,
              InvalidArgument, "adamw: gradients must be f32, bf16 or f16, got {}", dtype_name(grad_dtype));
  size_t with_model = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    if (t.model_param != nullptr) ++with_model;
    if (t.numel == 0) continue;
    TORUS_CHECK(t.param != nullptr && t.grad != nullptr && t.exp_avg != nullptr && t.exp_avg_sq != nullptr,
                InvalidArgument, "adamw: tensor {} ({} elements) has a null buffer", i, t.numel);
  }
  TORUS_CHECK(with_model == 0 || with_model == tensors.size(), InvalidArgument,
              "adamw: {} of {} tensors have a model copy; give one to every tensor or to none", with_model,
              tensors.size());
  bool has_model = with_model != 0;
  TORUS_CHECK(!has_model || model_dtype == DType::kBF16 || model_dtype == DType::kF16, InvalidArgument,
              "adamw: the model copy must be bf16 or f16, got {}", dtype_name(model_dtype));
  return has_model;
}

namespace {

float load(const void* p, size_t i, DType t) {
  switch (t) {
    case DType::kBF16: return ref::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return ref::f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

}  // namespace

void adamw_step_ref(std::span<const AdamWTensor> tensors, DType grad_dtype, DType model_dtype,
                    const AdamWConfig& config, const float* found_inf) {
  AdamWScalars s = adamw_scalars(config);
  bool has_model = adamw_check(tensors, grad_dtype, model_dtype);
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  for (const AdamWTensor& t : tensors) {
    for (size_t i = 0; i < t.numel; ++i) {
      float g = load(t.grad, i, grad_dtype) * s.inv_grad_scale;
      float p = t.param[i] * s.decay;
      float m = s.beta1 * t.exp_avg[i] + s.one_minus_beta1 * g;
      float v = s.beta2 * t.exp_avg_sq[i] + s.one_minus_beta2 * g * g;
      float denom = std::sqrt(v) / s.bc2_sqrt + s.eps;
      p = p - s.step_size * (m / denom);
      t.param[i] = p;
      t.exp_avg[i] = m;
      t.exp_avg_sq[i] = v;
      if (has_model) {
        auto* w = static_cast<uint16_t*>(t.model_param);
        w[i] = model_dtype == DType::kBF16 ? ref::f32_to_bf16(p) : ref::f32_to_f16(p);
      }
    }
  }
}

}  // namespace torus::kernels
