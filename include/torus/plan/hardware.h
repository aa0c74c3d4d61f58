// torus/plan/hardware.h — the machines the planner (torus/plan/planner.h)
// lays a run out on: the device layer's hardware table
// (torus/device/hardware.h), under the planner's names.
#pragma once

#include "torus/device/hardware.h"

namespace torus::plan {

using device::find_hardware;
using device::Hardware;
using device::hardware_names;
using device::hardware_presets;

}  // namespace torus::plan
