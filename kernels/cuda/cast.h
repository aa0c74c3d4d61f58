// kernels/cuda/cast.h — f32 <-> bf16/f16 casts on a CUDA device.
//
// Same contract as cast_ref (kernels/ref/cast_ref.h): round to nearest even,
// NaN stays NaN, overflow to infinity; a same-type "cast" is a copy. src and
// dst are device memory of the current device and must not overlap (except
// src == dst for a same-type cast).
//
// Stream: queued on `stream` (cudaStream_t as void*; nullptr = default
// stream); returns once queued. Throws InvalidArgument for an unsupported pair
// (cast_supported) or null buffers, torus::Error when the launch fails.
#pragma once

#include <cstddef>

#include "kernels/ref/cast_ref.h"
#include "torus/core/dtype.h"

namespace torus::kernels::cuda {

void cast(const void* src, DType from, void* dst, DType to, size_t n, void* stream);

}  // namespace torus::kernels::cuda
