// torus/core/format.h — numbers for people: bytes in binary units and
// durations, as the step line, the memory pre-check and the planner print
// them. Pure functions, no LibTorch.
#pragma once

#include <string>

namespace torus {

// Bytes in binary units with one decimal: "512 B", "3.0 KiB", "1.3 GiB".
std::string format_bytes(double bytes);

// A duration as "12s", "1m12s", "2h03m"; negative or non-finite: "?".
std::string format_duration(double seconds);

}  // namespace torus
