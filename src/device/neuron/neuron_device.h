// Private: the Neuron device (neuron_device.cpp) for the device registry and
// the Neuron comm backend.
#pragma once

#include "torus/device/device.h"
#include "torus/device/neuron.h"

namespace torus::device::neuron {

// The Neuron implementation of Device (Note [Neuron streams]).
Device& neuron_device();

// Whether `p` is Neuron device memory (an address of the reserved device
// region, Note [Neuron addresses]). False when the runtime is unavailable.
bool is_device_pointer(const void* p) noexcept;

}  // namespace torus::device::neuron
