// Host reduction and conversion kernels (see reduce.h).
//
// The loops are written so that GCC vectorises them; each hot entry point is
// cloned for AVX-512, AVX2 and baseline x86-64 with target_clones, and the
// loader picks the best clone for the CPU (ifunc). f16/bf16 are widened to
// f32 in registers, combined, and rounded once.
#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "core/log.h"

#if defined(__x86_64__) && !defined(__clang__)
#define TORUS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TORUS_CLONES
#endif

namespace torus::kernels {

// ---- scalar conversions -------------------------------------------------------

float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_float(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }

uint16_t float_to_f16(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }

namespace {

// Branch-free per-element conversions the vectoriser can handle.
inline float bf16_load(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }
inline uint16_t bf16_store(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  uint32_t nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>(((bits & 0x7fffffffu) > 0x7f800000u) ? nan : rounded);
}
inline float f16_load(uint16_t v) { return static_cast<float>(std::bit_cast<_Float16>(v)); }
inline uint16_t f16_store(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }

template <typename T>
inline T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<T>(a + b);
    case ReduceOp::kProd: return static_cast<T>(a * b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
  }
  return a;
}

// The op is hoisted out of the loop so every loop body is one simple
// operation the vectoriser recognises.
template <typename T>
inline void reduce_typed(T* __restrict dst, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(a[i] + b[i]);
      break;
    case ReduceOp::kProd:
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(a[i] * b[i]);
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) dst[i] = a[i] > b[i] ? a[i] : b[i];
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) dst[i] = a[i] < b[i] ? a[i] : b[i];
      break;
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
inline void reduce_half(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) dst[i] = Store(Load(a[i]) + Load(b[i]));
      break;
    case ReduceOp::kProd:
      for (size_t i = 0; i < n; ++i) dst[i] = Store(Load(a[i]) * Load(b[i]));
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) dst[i] = Store(std::max(Load(a[i]), Load(b[i])));
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) dst[i] = Store(std::min(Load(a[i]), Load(b[i])));
      break;
  }
}

template <float (*Load)(uint16_t)>
inline void acc_half(float* acc, const uint16_t* src, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) acc[i] += Load(src[i]);
      break;
    case ReduceOp::kProd:
      for (size_t i = 0; i < n; ++i) acc[i] *= Load(src[i]);
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], Load(src[i]));
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], Load(src[i]));
      break;
  }
}

}  // namespace

TORUS_CLONES
void reduce_into(void* dst, const void* a, const void* b, size_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::kF32:
      reduce_typed(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b), n, op);
      break;
    case DType::kF64:
      reduce_typed(static_cast<double*>(dst), static_cast<const double*>(a), static_cast<const double*>(b), n, op);
      break;
    case DType::kI32:
      reduce_typed(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a), static_cast<const int32_t*>(b), n,
                   op);
      break;
    case DType::kI64:
      reduce_typed(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), n,
                   op);
      break;
    case DType::kU8:
      reduce_typed(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), n,
                   op);
      break;
    case DType::kBF16:
      reduce_half<bf16_load, bf16_store>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                         static_cast<const uint16_t*>(b), n, op);
      break;
    case DType::kF16:
      reduce_half<f16_load, f16_store>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                       static_cast<const uint16_t*>(b), n, op);
      break;
  }
}

void reduce_inplace(void* dst, const void* src, size_t n, DType t, ReduceOp op) {
  reduce_into(dst, dst, src, n, t, op);
}

TORUS_CLONES
void reduce_half_into_f32(float* acc, const void* src, size_t n, DType half, ReduceOp op) {
  TORUS_CHECK(half == DType::kBF16 || half == DType::kF16, InvalidArgument,
              "reduce_half_into_f32 needs f16 or bf16, got {}", dtype_name(half));
  if (half == DType::kBF16) {
    acc_half<bf16_load>(acc, static_cast<const uint16_t*>(src), n, op);
  } else {
    acc_half<f16_load>(acc, static_cast<const uint16_t*>(src), n, op);
  }
}

TORUS_CLONES
void half_to_f32(const void* src, float* dst, size_t n, DType half) {
  const auto* s = static_cast<const uint16_t*>(src);
  if (half == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_load(s[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = f16_load(s[i]);
  }
}

TORUS_CLONES
void f32_to_half(const float* src, void* dst, size_t n, DType half) {
  auto* d = static_cast<uint16_t*>(dst);
  if (half == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) d[i] = bf16_store(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = f16_store(src[i]);
  }
}

void divide_inplace(void* buf, size_t n, DType t, int64_t divisor) {
  TORUS_CHECK(divisor > 0, InvalidArgument, "divide_inplace: divisor must be > 0, got {}", divisor);
  switch (t) {
    case DType::kF32: {
      auto* p = static_cast<float*>(buf);
      const float d = static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] /= d;
      break;
    }
    case DType::kF64: {
      auto* p = static_cast<double*>(buf);
      const double d = static_cast<double>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] /= d;
      break;
    }
    case DType::kI32: {
      auto* p = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(p[i] / divisor);
      break;
    }
    case DType::kI64: {
      auto* p = static_cast<int64_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] /= divisor;
      break;
    }
    case DType::kU8: {
      auto* p = static_cast<uint8_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(p[i] / divisor);
      break;
    }
    case DType::kBF16:
    case DType::kF16: {
      auto* p = static_cast<uint16_t*>(buf);
      const float d = static_cast<float>(divisor);
      if (t == DType::kBF16) {
        for (size_t i = 0; i < n; ++i) p[i] = bf16_store(bf16_load(p[i]) / d);
      } else {
        for (size_t i = 0; i < n; ++i) p[i] = f16_store(f16_load(p[i]) / d);
      }
      break;
    }
  }
}

const char* reduce_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
  return "scalar";
}

}  // namespace torus::kernels
