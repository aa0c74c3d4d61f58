// Whether every rank of a group succeeded (torus/comm/agree.h).
#include "torus/comm/agree.h"

#include <cstdint>

#include "torus/comm/backend.h"
#include "torus/device/device.h"

namespace torus::comm {

bool all_ok(Backend& group, bool ok, Duration timeout) {
  device::Device& dev = device::get_device(group.device_type());
  device::DeviceBuffer scalar(group.device_type(), sizeof(int32_t));
  int32_t failed = ok ? 0 : 1;
  dev.copy(scalar.data(), &failed, sizeof failed);
  group.all_reduce(scalar.data(), scalar.data(), 1, DType::kI32, ReduceOp::kMax, timeout)->wait();
  dev.copy(&failed, scalar.data(), sizeof failed);
  return failed == 0;
}

}  // namespace torus::comm
