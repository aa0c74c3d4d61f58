// kernels/cuda/unscale.h — multi-tensor gradient unscale with inf/NaN
// detection on a CUDA device.
//
// Same contract as unscale_grads_ref (kernels/ref/unscale_ref.h): every
// element is multiplied by inv_scale in place; *found_inf (device memory) is
// set to 1.0f when any input element is inf or NaN and is never cleared —
// zero it (e.g. with Device::fill_async) before the first call of a step.
// Up to 96 tensors per launch, any number per call.
//
// Stream: queued on `stream` (cudaStream_t as void*; nullptr = default
// stream); returns once queued. Throws InvalidArgument before queuing
// anything, torus::Error when a launch fails.
#pragma once

#include <span>

#include "kernels/ref/unscale_ref.h"
#include "torus/core/dtype.h"

namespace torus::kernels::cuda {

void unscale_grads(std::span<const GradTensor> grads, DType dtype, float inv_scale, float* found_inf, void* stream);

}  // namespace torus::kernels::cuda
