// neuron.h in a build without the Neuron device (src/device/sources.cmake
// compiles this file instead of the Neuron device's own): the runtime is
// reported missing and the allocator calls throw Unsupported.
#include "core/log.h"
#include "torus/device/neuron.h"

namespace torus::device::neuron {

RuntimeInfo runtime_info() noexcept {
  RuntimeInfo info;
  info.reason = "this Torus was built without the Neuron backend (configure with TORUS_WITH_NEURON=ON)";
  return info;
}

AllocatorStats allocator_stats() { throw Unsupported(runtime_info().reason); }
void empty_cache() { throw Unsupported(runtime_info().reason); }
void reset_peak_stats() { throw Unsupported(runtime_info().reason); }

}  // namespace torus::device::neuron
