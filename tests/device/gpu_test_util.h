// Test helper: GPU tests skip, with the reason, when no accelerator device is
// present (checked at run time through the device layer, never assumed).
// With TORUS_REQUIRE_GPU=1 in the environment (the GPU check script sets it)
// a missing device fails the test instead, so that a silent skip cannot pass
// for a GPU run.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "torus/device/device.h"

namespace torus::testing {

// True when the accelerator built into this library has a visible device;
// otherwise `why` says what is missing.
inline bool accelerator_present(std::string* why) {
  device::Device* a = device::accelerator();
  if (a == nullptr) {
    *why = "this build has no accelerator backend (TORUS_WITH_CUDA=OFF)";
    return false;
  }
  if (a->count() == 0) {
    *why = a->describe();
    return false;
  }
  return true;
}

inline bool gpu_required() {
  const char* v = std::getenv("TORUS_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace torus::testing

// Use at the top of a test body (or SetUp) that needs a device.
#define TORUS_REQUIRE_ACCELERATOR()                                                  \
  do {                                                                               \
    std::string torus_why_;                                                          \
    if (!::torus::testing::accelerator_present(&torus_why_)) {                       \
      if (::torus::testing::gpu_required()) FAIL() << "TORUS_REQUIRE_GPU=1 but " << torus_why_; \
      GTEST_SKIP() << "skipped, needs a GPU: " << torus_why_;                        \
    }                                                                                \
  } while (0)
