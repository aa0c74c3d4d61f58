// CUDA runtime errors as text and as exceptions (cuda_check.h).
#include "core/cuda_check.h"

#include "core/log.h"

namespace torus {

std::string cuda_error_string(int cuda_error) {
  auto e = static_cast<cudaError_t>(cuda_error);
  return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
}

namespace detail {

void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls are not blamed
  throw Error(fmt::format("CUDA error: {} failed: {} at {}:{}", expr, cuda_error_string(error), file, line));
}

}  // namespace detail
}  // namespace torus
