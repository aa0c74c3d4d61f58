// kernels/ref/cast_ref.h — CPU reference for the f32 <-> bf16/f16 casts
// (kernels/cuda/cast.h). Plain loops over kernels/ref/half.h.
#pragma once

#include <cstddef>

#include "torus/core/dtype.h"

namespace torus::kernels {

// True for the pairs the cast kernels serve: f32 -> bf16, f32 -> f16,
// bf16 -> f32, f16 -> f32, and any of f32/bf16/f16 to itself (a copy).
bool cast_supported(DType from, DType to);

// dst[i] = convert(src[i]) for i < n (round to nearest even; NaN stays NaN;
// overflow to infinity). src and dst must not overlap unless identical with
// from == to. Throws InvalidArgument for an unsupported pair.
void cast_ref(const void* src, DType from, void* dst, DType to, size_t n);

}  // namespace torus::kernels
