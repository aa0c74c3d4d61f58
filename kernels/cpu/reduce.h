// kernels/cpu/reduce.h — host reduction and conversion kernels used by the
// host backends (mpi, ofi). Plain buffers, no LibTorch.
//
// Each kernel is compiled for AVX-512, AVX2 and baseline x86-64 and the best
// one is chosen at run time (GCC function multi-versioning); the reference
// implementations in reduce_ref.cpp are the plain loops the tests compare
// against.
//
// f16 and bf16 are reduced in f32: reduce_f32_into_half() accumulates into an
// f32 buffer; converting once at the end gives one rounding per element, the
// same result on every rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "torus/core/dtype.h"
#include "torus/core/reduce_op.h"

namespace torus::kernels {

// dst[i] = dst[i] (op) src[i] for i < n, in dtype `t`. For kAvg this is a sum
// (divide afterwards with scale_inplace). f16/bf16 are combined in f32 and
// rounded once per call.
void reduce_inplace(void* dst, const void* src, size_t n, DType t, ReduceOp op);

// dst[i] = a[i] (op) b[i]. dst may alias a or b.
void reduce_into(void* dst, const void* a, const void* b, size_t n, DType t, ReduceOp op);

// Accumulate a half-precision buffer into f32: acc[i] = acc[i] (op) float(src[i]).
void reduce_half_into_f32(float* acc, const void* src, size_t n, DType half, ReduceOp op);

// buf[i] /= divisor (kAvg). Integers use truncating division.
void divide_inplace(void* buf, size_t n, DType t, int64_t divisor);

// Conversions between f16/bf16 and f32 (round to nearest even; NaN kept NaN).
void half_to_f32(const void* src, float* dst, size_t n, DType half);
void f32_to_half(const float* src, void* dst, size_t n, DType half);

// Scalar conversions (used by tests and by references).
float bf16_to_float(uint16_t v);
uint16_t float_to_bf16(float f);
float f16_to_float(uint16_t v);
uint16_t float_to_f16(float f);

// Name of the instruction set the dispatcher picked ("avx512", "avx2", "scalar").
const char* reduce_isa();

}  // namespace torus::kernels
