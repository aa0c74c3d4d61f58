// torus/parallel/data/offload.h — what ZeRO keeps in host memory. Free of
// LibTorch: the layout (parallel/layout.h) and the option table name it.
#pragma once

#include <cstdint>
#include <string_view>

namespace torus::dp {

enum class Offload : uint8_t {
  kNone,                // everything on the parameters' device
  kOptimizer,           // masters and optimizer state in host memory, updated by the CPU Adam
  kOptimizerAndParams,  // stage 3: the parameter shards too
};
std::string_view offload_name(Offload offload);  // "none" | "optimizer" | "optimizer+params"
// Throws InvalidArgument naming the accepted values.
Offload parse_offload(std::string_view text);

// The rules of a ZeRO stage and its offload, checked here once for every
// caller (the layout, the ZeRO object): stage 0-3; offload needs a stage >= 1;
// parameter offload needs stage 3. Throws InvalidArgument naming the rule.
void check_zero_stage(int stage, Offload offload);

}  // namespace torus::dp
