// The f32 <-> bf16/f16 cast kernels (contract: kernels/ref/cast_ref.h; host
// launcher: cast.cpp). A grid-stride loop over 4-element vectors when both
// pointers allow it, element by element otherwise.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/vec.cuh"

namespace torus::kernels::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;  // grid-stride beyond this: enough to fill any current GPU

template <typename S, typename D>
__global__ void __launch_bounds__(kThreads) cast_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  int64_t done = 0;
  if (aligned(src, 4 * sizeof(S)) && aligned(dst, 4 * sizeof(D))) {
    const int64_t nvec = n / 4;
    for (int64_t k = tid; k < nvec; k += stride) {
      float x[4];
      load4(src + 4 * k, x);
      store4(dst + 4 * k, x);
    }
    done = nvec * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) dst[i] = from_f32<D>(to_f32(src[i]));
}

template <typename S, typename D>
int launch(const void* src, void* dst, size_t n, cudaStream_t stream) {
  int64_t blocks = std::min<int64_t>((static_cast<int64_t>(n) / 4 + kThreads - 1) / kThreads + 1, kMaxBlocks);
  cast_kernel<S, D><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<const S*>(src),
                                                                           static_cast<D*>(dst),
                                                                           static_cast<int64_t>(n));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_cast(const void* src, DType from, void* dst, DType to, size_t n, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (from == DType::kF32 && to == DType::kBF16) return launch<float, __nv_bfloat16>(src, dst, n, s);
  if (from == DType::kF32 && to == DType::kF16) return launch<float, __half>(src, dst, n, s);
  if (from == DType::kBF16 && to == DType::kF32) return launch<__nv_bfloat16, float>(src, dst, n, s);
  if (from == DType::kF16 && to == DType::kF32) return launch<__half, float>(src, dst, n, s);
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace torus::kernels::cuda::detail
