// Host launcher of the fused AdamW kernel (kernels/cuda/adamw.h): validates
// the call, packs tensors into batches (kernels/cuda/launch.h) and launches
// one kernel per batch.
#include "kernels/cuda/adamw.h"

#include "core/log.h"
#include "kernels/cuda/launch.h"

namespace torus::kernels::cuda {

void adamw_step(std::span<const AdamWTensor> tensors, DType grad_dtype, DType model_dtype, const AdamWConfig& config,
                const float* found_inf, void* stream) {
  const AdamWScalars scalars = adamw_scalars(config);
  const bool has_model = adamw_check(tensors, grad_dtype, model_dtype);
  const DType model = has_model ? model_dtype : DType::kF32;

  detail::AdamWBatch batch{};
  int64_t chunks = 0;
  auto flush = [&] {
    if (batch.num_tensors == 0) return;
    batch.chunk_start[batch.num_tensors] = static_cast<int32_t>(chunks);
    detail::check_launch(detail::launch_adamw(batch, scalars, grad_dtype, model, found_inf, stream), "adamw");
    batch.num_tensors = 0;
    chunks = 0;
  };
  for (const AdamWTensor& t : tensors) {
    if (t.numel == 0) continue;
    int64_t n = static_cast<int64_t>(t.numel);
    int64_t tensor_chunks = (n + detail::kChunkElems - 1) / detail::kChunkElems;
    // One launch holds at most 2^31 - 1 blocks; a single tensor never comes near.
    if (batch.num_tensors == detail::kAdamWMaxTensors || chunks + tensor_chunks > INT32_MAX) flush();
    int k = batch.num_tensors++;
    batch.param[k] = t.param;
    batch.grad[k] = t.grad;
    batch.exp_avg[k] = t.exp_avg;
    batch.exp_avg_sq[k] = t.exp_avg_sq;
    batch.model[k] = t.model_param;
    batch.numel[k] = n;
    batch.chunk_start[k] = static_cast<int32_t>(chunks);
    chunks += tensor_chunks;
  }
  flush();
}

}  // namespace torus::kernels::cuda
