// Private: the CUDA implementation of torus::device::Device, for the other
// parts of the CUDA backend (the nccl comm backend). Free of CUDA types, like
// the public interface. CUDA errors: core/cuda_check.h.
#pragma once

#include "torus/device/device.h"

namespace torus::device::cuda {

// The process-wide CUDA device implementation.
Device& cuda_device();

// Makes device `index` current on the calling thread for the guard's
// lifetime and restores the previous one afterwards. Throws Error.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
  bool changed_;
};

}  // namespace torus::device::cuda
