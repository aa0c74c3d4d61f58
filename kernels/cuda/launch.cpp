// Launch error reporting shared by the host launchers (kernels/cuda/launch.h).
#include "kernels/cuda/launch.h"

#include "core/cuda_check.h"
#include "core/log.h"

namespace torus::kernels::cuda::detail {

void check_launch(int cuda_error, const char* kernel) {
  if (cuda_error == 0) return;
  throw Error(fmt::format("CUDA error: launching the {} kernel failed: {}", kernel,
                          cuda_error_string(cuda_error)));
}

}  // namespace torus::kernels::cuda::detail
