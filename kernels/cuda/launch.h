// kernels/cuda/launch.h — private: the plain-C++ interface between the host
// launchers (adamw.cpp, unscale.cpp, cast.cpp: validation, batching, errors)
// and the CUDA translation units (*_kernel.cu: kernels only). Kept free of
// CUDA types so that the host side compiles with the C++ compiler alone.
//
// Multi-tensor kernels take a batch of up to kMax* tensors by value as a
// kernel parameter (under the 4 KiB parameter limit; __grid_constant__, so
// indexing it never copies it to local memory). Each tensor is cut into
// chunks of kChunkElems elements; chunk_start[t] is the index of tensor t's
// first chunk, and one thread block handles one chunk.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ref/adamw_types.h"
#include "torus/core/dtype.h"

namespace torus::kernels::cuda::detail {

inline constexpr int64_t kChunkElems = 65536;
inline constexpr int kAdamWMaxTensors = 48;
inline constexpr int kUnscaleMaxTensors = 96;

struct AdamWBatch {
  float* param[kAdamWMaxTensors];
  const void* grad[kAdamWMaxTensors];
  float* exp_avg[kAdamWMaxTensors];
  float* exp_avg_sq[kAdamWMaxTensors];
  void* model[kAdamWMaxTensors];
  int64_t numel[kAdamWMaxTensors];
  int32_t chunk_start[kAdamWMaxTensors + 1];
  int32_t num_tensors;
};

struct UnscaleBatch {
  void* data[kUnscaleMaxTensors];
  int64_t numel[kUnscaleMaxTensors];
  int32_t chunk_start[kUnscaleMaxTensors + 1];
  int32_t num_tensors;
};

static_assert(sizeof(AdamWBatch) + sizeof(AdamWScalars) + 64 < 4096, "kernel parameters exceed 4 KiB");
static_assert(sizeof(UnscaleBatch) + 64 < 4096, "kernel parameters exceed 4 KiB");

// Each returns the cudaError_t of the launch (0: queued). `model` is kF32
// when the batch carries no model copy. `stream` is a cudaStream_t.
int launch_adamw(const AdamWBatch& batch, const AdamWScalars& scalars, DType grad, DType model,
                 const float* found_inf, void* stream);
int launch_unscale(const UnscaleBatch& batch, DType dtype, float inv_scale, float* found_inf, void* stream);
int launch_cast(const void* src, DType from, void* dst, DType to, size_t n, void* stream);

// Throws torus::Error naming `kernel` when `cuda_error` is not 0 (launch.cpp).
void check_launch(int cuda_error, const char* kernel);

}  // namespace torus::kernels::cuda::detail
