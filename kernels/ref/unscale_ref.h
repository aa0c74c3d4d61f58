// kernels/ref/unscale_ref.h — CPU reference for the gradient unscale with
// inf/NaN detection (kernels/cuda/unscale.h), the step that dynamic loss
// scaling runs on every gradient before the optimizer.
#pragma once

#include <cstddef>
#include <span>

#include "torus/core/dtype.h"

namespace torus::kernels {

// One gradient buffer of `numel` elements (dtype given per call).
struct GradTensor {
  void* data = nullptr;
  size_t numel = 0;
};

// For every element x of every tensor: if x is not finite, *found_inf = 1.0f;
// then x = x * inv_scale, computed in f32 and stored back in `dtype` (round to
// nearest even). *found_inf is only ever set, never cleared: zero it before
// the first call of a step (the semantics of LibTorch's
// _amp_foreach_non_finite_check_and_unscale_). dtype: f32, bf16 or f16.
// Throws InvalidArgument for another dtype or a null buffer with numel > 0.
void unscale_grads_ref(std::span<const GradTensor> grads, DType dtype, float inv_scale, float* found_inf);

}  // namespace torus::kernels
