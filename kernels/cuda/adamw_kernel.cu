// The multi-tensor fused AdamW kernel (contract: kernels/ref/adamw_ref.h;
// host launcher: adamw.cpp). One thread block updates one chunk of
// kChunkElems elements of one tensor; each thread moves 4-element vectors,
// two at a time, so that enough bytes are in flight to saturate HBM: per
// element it reads p, m, v and g and writes p, m, v and the model copy once.
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/vec.cuh"

namespace torus::kernels::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;

struct NoModel {};  // W when the tensors carry no model copy

__device__ __forceinline__ void adamw_update(float& p, float& m, float& v, float g, const AdamWScalars& s) {
  g *= s.inv_grad_scale;
  p *= s.decay;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
  p -= s.step_size * (m / denom);
}

template <typename G, typename W>
__global__ void __launch_bounds__(kThreads, 4)
    adamw_kernel(const __grid_constant__ AdamWBatch b, const AdamWScalars s, const float* __restrict__ found_inf) {
  constexpr bool kModel = !std::is_same_v<W, NoModel>;
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const int chunk = static_cast<int>(blockIdx.x);
  const int t = find_tensor(b.chunk_start, b.num_tensors, chunk);
  const int64_t begin = static_cast<int64_t>(chunk - b.chunk_start[t]) * kChunkElems;
  const int64_t n = min(kChunkElems, b.numel[t] - begin);
  float* __restrict__ p = b.param[t] + begin;
  float* __restrict__ m = b.exp_avg[t] + begin;
  float* __restrict__ v = b.exp_avg_sq[t] + begin;
  const G* __restrict__ g = static_cast<const G*>(b.grad[t]) + begin;
  W* __restrict__ w = kModel ? static_cast<W*>(b.model[t]) + begin : nullptr;

  int64_t done = 0;
  bool vec = aligned(p, 16) && aligned(m, 16) && aligned(v, 16) && aligned(g, 4 * sizeof(G));
  if constexpr (kModel) vec = vec && aligned(w, 4 * sizeof(W));
  if (vec) {
    const int64_t nvec = n / 4 * 4;
    for (int64_t base = threadIdx.x * 4; base < nvec; base += kThreads * 4 * kUnroll) {
      float pp[kUnroll][4], mm[kUnroll][4], vv[kUnroll][4], gg[kUnroll][4];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        int64_t i = base + u * kThreads * 4;
        if (i < nvec) {
          load4(p + i, pp[u]);
          load4(m + i, mm[u]);
          load4(v + i, vv[u]);
          load4(g + i, gg[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        int64_t i = base + u * kThreads * 4;
        if (i < nvec) {
#pragma unroll
          for (int k = 0; k < 4; ++k) adamw_update(pp[u][k], mm[u][k], vv[u][k], gg[u][k], s);
          store4(p + i, pp[u]);
          store4(m + i, mm[u]);
          store4(v + i, vv[u]);
          if constexpr (kModel) store4(w + i, pp[u]);
        }
      }
    }
    done = nvec;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += kThreads) {
    float pi = p[i];
    float mi = m[i];
    float vi = v[i];
    adamw_update(pi, mi, vi, to_f32(g[i]), s);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kModel) w[i] = from_f32<W>(pi);
  }
}

template <typename G, typename W>
int launch(const AdamWBatch& b, const AdamWScalars& s, const float* found_inf, cudaStream_t stream) {
  adamw_kernel<G, W><<<b.chunk_start[b.num_tensors], kThreads, 0, stream>>>(b, s, found_inf);
  return static_cast<int>(cudaGetLastError());
}

template <typename G>
int launch_for_model(const AdamWBatch& b, const AdamWScalars& s, DType model, const float* found_inf,
                     cudaStream_t stream) {
  switch (model) {
    case DType::kBF16: return launch<G, __nv_bfloat16>(b, s, found_inf, stream);
    case DType::kF16: return launch<G, __half>(b, s, found_inf, stream);
    default: return launch<G, NoModel>(b, s, found_inf, stream);
  }
}

}  // namespace

int launch_adamw(const AdamWBatch& batch, const AdamWScalars& scalars, DType grad, DType model,
                 const float* found_inf, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (grad) {
    case DType::kBF16: return launch_for_model<__nv_bfloat16>(batch, scalars, model, found_inf, s);
    case DType::kF16: return launch_for_model<__half>(batch, scalars, model, found_inf, s);
    case DType::kF32: return launch_for_model<float>(batch, scalars, model, found_inf, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace torus::kernels::cuda::detail
