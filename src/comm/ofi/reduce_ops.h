// Private: the reduction helpers the ofi algorithms share, on top of the
// vectorised kernels (kernels/cpu/reduce.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/reduce.h"
#include "torus/comm/types.h"
#include "torus/core/dtype.h"

namespace torus::comm::ofi {

constexpr bool is_half(DType t) { return t == DType::kF16 || t == DType::kBF16; }

// kAvg is carried as a sum until the final division.
constexpr ReduceOp carried(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

inline void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

namespace detail {

// A handful of elements (latency-bound ops): a plain loop beats the
// dispatching vector kernels' setup.
inline constexpr size_t kSmallReduce = 16;

template <typename T>
inline void reduce_small(T* d, const T* a, const T* b, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: d[i] = static_cast<T>(a[i] + b[i]); break;
      case ReduceOp::kProd: d[i] = static_cast<T>(a[i] * b[i]); break;
      case ReduceOp::kMax: d[i] = a[i] > b[i] ? a[i] : b[i]; break;  // as kernels/cpu does
      case ReduceOp::kMin: d[i] = a[i] < b[i] ? a[i] : b[i]; break;
    }
  }
}

// Returns false when the generic kernel must do it (halves, longer buffers).
inline bool reduce_into_small(void* dst, const void* a, const void* b, size_t n, DType t, ReduceOp op) {
  if (n > kSmallReduce) return false;
  switch (t) {
    case DType::kF32: reduce_small(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b), n, op); return true;
    case DType::kF64: reduce_small(static_cast<double*>(dst), static_cast<const double*>(a), static_cast<const double*>(b), n, op); return true;
    case DType::kI32: reduce_small(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a), static_cast<const int32_t*>(b), n, op); return true;
    case DType::kI64: reduce_small(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), n, op); return true;
    case DType::kU8: reduce_small(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), n, op); return true;
    default: return false;
  }
}

}  // namespace detail

inline void reduce_inplace(void* dst, const void* src, size_t n, DType t, ReduceOp op) {
  if (n == 0 || detail::reduce_into_small(dst, dst, src, n, t, op)) return;
  kernels::reduce_inplace(dst, src, n, t, carried(op));
}

inline void reduce_into(void* dst, const void* a, const void* b, size_t n, DType t, ReduceOp op) {
  if (n == 0 || detail::reduce_into_small(dst, a, b, n, t, op)) return;
  kernels::reduce_into(dst, a, b, n, t, carried(op));
}

inline void divide(void* buf, size_t n, DType t, int64_t divisor) {
  if (divisor > 1 && n > 0) kernels::divide_inplace(buf, n, t, divisor);
}

}  // namespace torus::comm::ofi
