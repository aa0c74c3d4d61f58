// CPU reference for the gradient unscale (kernels/ref/unscale_ref.h).
#include "kernels/ref/unscale_ref.h"

#include <cmath>
#include <cstdint>

#include "core/log.h"
#include "kernels/ref/half.h"

namespace torus::kernels {

void unscale_grads_ref(std::span<const GradTensor> grads, DType dtype, float inv_scale, float* found_inf) {
  TORUS_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16, InvalidArgument,
              "unscale: gradients must be f32, bf16 or f16, got {}", dtype_name(dtype));
  TORUS_CHECK(found_inf != nullptr, InvalidArgument, "unscale: found_inf must not be null");
  for (const GradTensor& t : grads) {
    TORUS_CHECK(t.data != nullptr || t.numel == 0, InvalidArgument, "unscale: null gradient with {} elements",
                t.numel);
    for (size_t i = 0; i < t.numel; ++i) {
      float x;
      if (dtype == DType::kF32) {
        x = static_cast<float*>(t.data)[i];
      } else {
        uint16_t h = static_cast<uint16_t*>(t.data)[i];
        x = dtype == DType::kBF16 ? ref::bf16_to_f32(h) : ref::f16_to_f32(h);
      }
      if (!std::isfinite(x)) *found_inf = 1.0f;
      float y = x * inv_scale;
      if (dtype == DType::kF32) {
        static_cast<float*>(t.data)[i] = y;
      } else {
        static_cast<uint16_t*>(t.data)[i] = dtype == DType::kBF16 ? ref::f32_to_bf16(y) : ref::f32_to_f16(y);
      }
    }
  }
}

}  // namespace torus::kernels
