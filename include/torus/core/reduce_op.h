// torus/core/reduce_op.h — the reduction operators of collectives and of the
// host reduction kernels: a value shared by the comm layer (collective
// options, comm/types.h re-exports it as comm::ReduceOp) and kernels/cpu,
// which combine plain buffers with it. Free of LibTorch.
#pragma once

#include <cstdint>
#include <string_view>

namespace torus {

// kAvg combines as a sum; the caller divides by the number of contributions.
enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin, kProd };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax,
                                             ReduceOp::kMin, ReduceOp::kProd};

std::string_view reduce_op_name(ReduceOp op);         // "sum", "avg", "max", "min", "prod"
ReduceOp reduce_op_from_name(std::string_view name);  // the inverse; throws InvalidArgument

}  // namespace torus
