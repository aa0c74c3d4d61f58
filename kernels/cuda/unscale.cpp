// Host launcher of the gradient unscale kernel (kernels/cuda/unscale.h).
#include "kernels/cuda/unscale.h"

#include "core/log.h"
#include "kernels/cuda/launch.h"

namespace torus::kernels::cuda {

void unscale_grads(std::span<const GradTensor> grads, DType dtype, float inv_scale, float* found_inf, void* stream) {
  TORUS_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16, InvalidArgument,
              "unscale: gradients must be f32, bf16 or f16, got {}", dtype_name(dtype));
  TORUS_CHECK(found_inf != nullptr, InvalidArgument, "unscale: found_inf must not be null");
  for (const GradTensor& t : grads) {
    TORUS_CHECK(t.data != nullptr || t.numel == 0, InvalidArgument, "unscale: null gradient with {} elements",
                t.numel);
  }
  detail::UnscaleBatch batch{};
  int64_t chunks = 0;
  auto flush = [&] {
    if (batch.num_tensors == 0) return;
    batch.chunk_start[batch.num_tensors] = static_cast<int32_t>(chunks);
    detail::check_launch(detail::launch_unscale(batch, dtype, inv_scale, found_inf, stream), "unscale");
    batch.num_tensors = 0;
    chunks = 0;
  };
  for (const GradTensor& t : grads) {
    if (t.numel == 0) continue;
    int64_t n = static_cast<int64_t>(t.numel);
    int64_t tensor_chunks = (n + detail::kChunkElems - 1) / detail::kChunkElems;
    if (batch.num_tensors == detail::kUnscaleMaxTensors || chunks + tensor_chunks > INT32_MAX) flush();
    int k = batch.num_tensors++;
    batch.data[k] = t.data;
    batch.numel[k] = n;
    batch.chunk_start[k] = static_cast<int32_t>(chunks);
    chunks += tensor_chunks;
  }
  flush();
}

}  // namespace torus::kernels::cuda
