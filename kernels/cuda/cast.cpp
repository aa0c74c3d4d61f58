// Host launcher of the cast kernels (kernels/cuda/cast.h).
#include "kernels/cuda/cast.h"

#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/log.h"
#include "kernels/cuda/launch.h"

namespace torus::kernels::cuda {

void cast(const void* src, DType from, void* dst, DType to, size_t n, void* stream) {
  TORUS_CHECK(cast_supported(from, to), InvalidArgument, "cast from {} to {} is not supported", dtype_name(from),
              dtype_name(to));
  if (n == 0) return;
  TORUS_CHECK(src != nullptr && dst != nullptr, InvalidArgument, "cast: null buffer for {} elements", n);
  if (from == to) {
    if (src != dst) {
      TORUS_CHECK_CUDA(cudaMemcpyAsync(dst, src, n * dtype_size(from), cudaMemcpyDeviceToDevice,
                                       static_cast<cudaStream_t>(stream)));
    }
    return;
  }
  detail::check_launch(detail::launch_cast(src, from, dst, to, n, stream), "cast");
}

}  // namespace torus::kernels::cuda
