// kernels/cuda/adamw.h — the multi-tensor fused AdamW step on a CUDA device.
//
// Same contract and arithmetic as the CPU reference adamw_step_ref
// (kernels/ref/adamw_ref.h): f32 master weights and moments, f32/bf16/f16
// gradients, an optional bf16/f16 model copy written back, the step skipped
// when *found_inf != 0. Any number of tensors of any sizes go into one call;
// they are processed in launches of up to 48 tensors, each tensor cut into
// chunks of 64 Ki elements (one thread block per chunk).
//
// Memory: every pointer is device memory of the current device (found_inf
// too, or null). Vector loads are used when the buffers are 16-byte aligned
// (f32) / 8-byte aligned (16-bit), which allocator-made tensors are; other
// buffers take a slower element-wise path.
//
// Stream: work is queued on `stream` (a cudaStream_t passed as void*;
// nullptr = the default stream) and the call returns once queued. Throws
// InvalidArgument on bad arguments before queuing anything, torus::Error
// when a launch fails (earlier launches of the same call stay queued).
#pragma once

#include <span>

#include "kernels/ref/adamw_ref.h"
#include "torus/core/dtype.h"

namespace torus::kernels::cuda {

void adamw_step(std::span<const AdamWTensor> tensors, DType grad_dtype, DType model_dtype, const AdamWConfig& config,
                const float* found_inf, void* stream);

}  // namespace torus::kernels::cuda
