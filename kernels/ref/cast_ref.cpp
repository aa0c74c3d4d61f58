// CPU reference for the casts (kernels/ref/cast_ref.h).
#include "kernels/ref/cast_ref.h"

#include <cstdint>
#include <cstring>

#include "core/log.h"
#include "kernels/ref/half.h"

namespace torus::kernels {
namespace {

bool is_float_type(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

}  // namespace

bool cast_supported(DType from, DType to) {
  if (!is_float_type(from) || !is_float_type(to)) return false;
  return from == to || from == DType::kF32 || to == DType::kF32;
}

void cast_ref(const void* src, DType from, void* dst, DType to, size_t n) {
  TORUS_CHECK(cast_supported(from, to), InvalidArgument, "cast from {} to {} is not supported", dtype_name(from),
              dtype_name(to));
  if (n == 0) return;
  if (from == to) {
    if (src != dst) std::memcpy(dst, src, n * dtype_size(from));
    return;
  }
  if (from == DType::kF32) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = to == DType::kBF16 ? ref::f32_to_bf16(s[i]) : ref::f32_to_f16(s[i]);
  } else {
    const auto* s = static_cast<const uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = from == DType::kBF16 ? ref::bf16_to_f32(s[i]) : ref::f16_to_f32(s[i]);
  }
}

}  // namespace torus::kernels
