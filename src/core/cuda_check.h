// Private: the one check macro for the CUDA runtime, for every part of Torus
// that calls it (the CUDA device, the kernel launchers); built with
// TORUS_WITH_CUDA only.
//
//   TORUS_CHECK_CUDA(cudaMalloc(&p, n));
//
// throws torus::Error("CUDA error: cudaMalloc(&p, n) failed: out of memory
// (cudaErrorMemoryAllocation) at file:line") when the call does not return
// cudaSuccess. It lives in core, below both users, so that kernels/ need not
// include the device layer. It pulls in the CUDA runtime header.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace torus {

// The CUDA runtime's text for an error code (a cudaError_t as an int, so
// that callers free of CUDA types can pass one): "message (cudaErrorName)".
std::string cuda_error_string(int cuda_error);

namespace detail {

// Clears the runtime's last error (when it is not sticky) and throws.
[[noreturn]] void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line);

}  // namespace detail
}  // namespace torus

#define TORUS_CHECK_CUDA(expr)                                                               \
  do {                                                                                       \
    cudaError_t torus_cuda_err_ = (expr);                                                    \
    if (torus_cuda_err_ != cudaSuccess) [[unlikely]] {                                       \
      ::torus::detail::throw_cuda_error(torus_cuda_err_, #expr, __FILE__, __LINE__);         \
    }                                                                                        \
  } while (0)
