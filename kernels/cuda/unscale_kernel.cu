// The multi-tensor gradient unscale kernel (contract:
// kernels/ref/unscale_ref.h; host launcher: unscale.cpp). One thread block
// handles one chunk of one tensor; a thread that sees a non-finite input sets
// *found_inf = 1 (every writer writes the same value, so the race is benign).
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/vec.cuh"

namespace torus::kernels::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <typename G>
__global__ void __launch_bounds__(kThreads)
    unscale_kernel(const __grid_constant__ UnscaleBatch b, float inv_scale, float* __restrict__ found_inf) {
  const int chunk = static_cast<int>(blockIdx.x);
  const int t = find_tensor(b.chunk_start, b.num_tensors, chunk);
  const int64_t begin = static_cast<int64_t>(chunk - b.chunk_start[t]) * kChunkElems;
  const int64_t n = min(kChunkElems, b.numel[t] - begin);
  G* __restrict__ g = static_cast<G*>(b.data[t]) + begin;

  bool bad = false;
  int64_t done = 0;
  if (aligned(g, 4 * sizeof(G))) {
    const int64_t nvec = n / 4 * 4;
    for (int64_t base = threadIdx.x * 4; base < nvec; base += kThreads * 4 * kUnroll) {
      float x[kUnroll][4];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        int64_t i = base + u * kThreads * 4;
        if (i < nvec) load4(g + i, x[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        int64_t i = base + u * kThreads * 4;
        if (i < nvec) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            bad |= !isfinite(x[u][k]);
            x[u][k] *= inv_scale;
          }
          store4(g + i, x[u]);
        }
      }
    }
    done = nvec;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += kThreads) {
    float x = to_f32(g[i]);
    bad |= !isfinite(x);
    g[i] = from_f32<G>(x * inv_scale);
  }
  if (bad) *found_inf = 1.0f;
}

template <typename G>
int launch(const UnscaleBatch& b, float inv_scale, float* found_inf, cudaStream_t stream) {
  unscale_kernel<G><<<b.chunk_start[b.num_tensors], kThreads, 0, stream>>>(b, inv_scale, found_inf);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_unscale(const UnscaleBatch& batch, DType dtype, float inv_scale, float* found_inf, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kF32: return launch<float>(batch, inv_scale, found_inf, s);
    case DType::kBF16: return launch<__nv_bfloat16>(batch, inv_scale, found_inf, s);
    case DType::kF16: return launch<__half>(batch, inv_scale, found_inf, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace torus::kernels::cuda::detail
