// kernels/ref/adamw_types.h — the plain data of the AdamW step (see
// kernels/ref/adamw_ref.h for the contract). Kept to C++17 so that the CUDA
// translation units can include it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torus::kernels {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  int64_t step = 1;              // the step being taken, from 1 (bias correction)
  float inv_grad_scale = 1.0f;   // 1 / loss scale; 1 when gradients are unscaled
};

// One parameter tensor: numel elements in each buffer.
struct AdamWTensor {
  float* param = nullptr;        // f32 master weights (read, written)
  const void* grad = nullptr;    // gradient in the call's grad dtype (read)
  float* exp_avg = nullptr;      // f32 first moment (read, written)
  float* exp_avg_sq = nullptr;   // f32 second moment (read, written)
  void* model_param = nullptr;   // bf16/f16 model copy (written); null: none
  size_t numel = 0;
};

// The per-step scalars, derived once on the host.
struct AdamWScalars {
  float beta1 = 0;
  float beta2 = 0;
  float one_minus_beta1 = 0;
  float one_minus_beta2 = 0;
  float eps = 0;
  float decay = 1;          // 1 - lr * weight_decay
  float step_size = 0;      // lr / bc1
  float bc2_sqrt = 1;       // sqrt(bc2)
  float inv_grad_scale = 1;
};

}  // namespace torus::kernels
