// Private: the one check macro for the CUDA runtime.
//
//   TORUS_CHECK_CUDA(cudaMalloc(&p, n));
//
// throws torus::Error("CUDA error: cudaMalloc(&p, n) failed: out of memory
// (cudaErrorMemoryAllocation) at file:line") when the call does not return
// cudaSuccess. Only files of the CUDA backend include this (it pulls in the
// CUDA runtime header).
#pragma once

#include <cuda_runtime_api.h>

namespace torus::device::cuda::detail {

// Clears the runtime's last error (when it is not sticky) and throws.
[[noreturn]] void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line);

}  // namespace torus::device::cuda::detail

#define TORUS_CHECK_CUDA(expr)                                                             \
  do {                                                                                     \
    cudaError_t torus_cuda_err_ = (expr);                                                  \
    if (torus_cuda_err_ != cudaSuccess) [[unlikely]] {                                     \
      ::torus::device::cuda::detail::throw_cuda_error(torus_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)
