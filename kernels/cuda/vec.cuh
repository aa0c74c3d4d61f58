// kernels/cuda/vec.cuh — private device helpers shared by the kernels:
// conversions to and from f32, and 4-element vector loads and stores
// (16 bytes of f32, 8 bytes of bf16/f16) with streaming cache hints, since
// every kernel here touches each byte once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace torus::kernels::cuda::detail {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// 4 consecutive elements starting at p (16-byte aligned for f32, 8-byte for
// 16-bit types).
__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
  float4 x = __ldcs(reinterpret_cast<const float4*>(p));
  v[0] = x.x;
  v[1] = x.y;
  v[2] = x.z;
  v[3] = x.w;
}

template <typename H>
__device__ __forceinline__ void load4_16(const H* p, float (&v)[4]) {
  uint2 raw = __ldcs(reinterpret_cast<const uint2*>(p));
  uint16_t h[4] = {static_cast<uint16_t>(raw.x & 0xffffu), static_cast<uint16_t>(raw.x >> 16),
                   static_cast<uint16_t>(raw.y & 0xffffu), static_cast<uint16_t>(raw.y >> 16)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    H x;
    __builtin_memcpy(&x, &h[i], 2);
    v[i] = to_f32(x);
  }
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float (&v)[4]) { load4_16(p, v); }
__device__ __forceinline__ void load4(const __half* p, float (&v)[4]) { load4_16(p, v); }

__device__ __forceinline__ void store4(float* p, const float (&v)[4]) {
  __stcs(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
}

template <typename H>
__device__ __forceinline__ void store4_16(H* p, const float (&v)[4]) {
  uint16_t h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    H x = from_f32<H>(v[i]);
    __builtin_memcpy(&h[i], &x, 2);
  }
  uint2 raw = make_uint2(static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16),
                         static_cast<uint32_t>(h[2]) | (static_cast<uint32_t>(h[3]) << 16));
  __stcs(reinterpret_cast<uint2*>(p), raw);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float (&v)[4]) { store4_16(p, v); }
__device__ __forceinline__ void store4(__half* p, const float (&v)[4]) { store4_16(p, v); }

__device__ __forceinline__ bool aligned(const void* p, unsigned bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// The tensor whose chunk range holds `chunk` (chunk_start is increasing).
__device__ __forceinline__ int find_tensor(const int32_t* chunk_start, int num_tensors, int chunk) {
  int lo = 0;
  int hi = num_tensors - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (chunk_start[mid] <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace torus::kernels::cuda::detail
