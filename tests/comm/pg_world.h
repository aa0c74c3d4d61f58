// Test helper: the world ProcessGroup of a tensor-level test binary, made by
// torus::init on first use and shared by every test file of the binary (one
// Context per process).
#pragma once

#include "torus/comm/process_group.h"

namespace torus::comm {

inline const ProcessGroupPtr& world() {
  static ProcessGroupPtr w = torus::init();
  return w;
}

}  // namespace torus::comm
