// kernels/ref/adamw_ref.h — the AdamW step: its contract, the scalars both
// implementations derive from the hyper-parameters, and the CPU reference
// that the multi-tensor CUDA kernel (kernels/cuda/adamw.h) is checked against.
//
// Mixed precision layout: the optimizer owns f32 master weights and f32
// moments; gradients arrive in f32, bf16 or f16; the updated master weight is
// optionally written back, rounded to nearest even, into the model's bf16 or
// f16 copy. Per element, in f32 (the order of LibTorch's fused AdamW):
//
//   g  = grad * inv_grad_scale
//   p  = p * (1 - lr * weight_decay)            decoupled weight decay
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
//   model = round(p)                             when a model copy is given
//
// with bc1 = 1 - beta1^step and bc2 = 1 - beta2^step (computed in double).
// When found_inf is given and non-zero, nothing is changed (the step is
// skipped, as after a gradient overflow under loss scaling).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/ref/adamw_types.h"
#include "torus/core/dtype.h"

namespace torus::kernels {

// Validates `config` (step >= 1, 0 <= beta < 1, lr >= 0, eps > 0,
// weight_decay >= 0, finite inv_grad_scale) and derives the scalars. Throws
// InvalidArgument.
AdamWScalars adamw_scalars(const AdamWConfig& config);

// Validates a call (shared by the reference and the CUDA launcher): grad
// dtype f32/bf16/f16; either every tensor has a model copy (model dtype bf16
// or f16) or none has; no null buffer with numel > 0. Throws InvalidArgument.
// Returns whether the tensors carry a model copy.
bool adamw_check(std::span<const AdamWTensor> tensors, DType grad_dtype, DType model_dtype);

// The reference: one AdamW step over every tensor, on host memory.
// found_inf: host pointer or null.
void adamw_step_ref(std::span<const AdamWTensor> tensors, DType grad_dtype, DType model_dtype,
                    const AdamWConfig& config, const float* found_inf = nullptr);

}  // namespace torus::kernels
