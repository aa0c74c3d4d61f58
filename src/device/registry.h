// Private: the table the device kinds fill (Note [Device registration] in
// torus/device/device.h). Each kind's file defines
//   void register_<kind>_device(DeviceRegistry& registry);
// which adds its process-wide Device. src/CMakeLists.txt generates
// register_built_devices(), which calls the functions of the kinds this build
// compiles; the registry runs it once, before the first lookup.
#pragma once

#include <vector>

#include "torus/device/device.h"

namespace torus::device {

class DeviceRegistry {
 public:
  // Adds `device`, which lives for the whole process. Throws InvalidArgument
  // when its type is registered already or when it would be a second
  // accelerator (a build has at most one).
  void add(Device& device);
  const std::vector<Device*>& devices() const { return devices_; }

 private:
  std::vector<Device*> devices_;
};

// Generated (src/CMakeLists.txt): declares and calls
// register_<kind>_device for every device kind of this build, in the order
// the build lists them.
void register_built_devices(DeviceRegistry& registry);

}  // namespace torus::device
