// Private: the CUDA implementation of torus::device::Device, for the other
// parts of the CUDA backend (the nccl comm backend, kernel launchers). Free of
// CUDA types, like the public interface.
#pragma once

#include <string>

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

// The CUDA runtime's text for an error code, "message (cudaErrorName)".
std::string error_string(int cuda_error);

}  // namespace torus::device::cuda
