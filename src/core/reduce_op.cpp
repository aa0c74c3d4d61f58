// Names of the reduction operators (torus/core/reduce_op.h).
#include "torus/core/reduce_op.h"

#include "core/log.h"

namespace torus {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

ReduceOp reduce_op_from_name(std::string_view name) {
  for (ReduceOp op : kAllReduceOps) {
    if (reduce_op_name(op) == name) return op;
  }
  throw InvalidArgument(fmt::format("unknown reduce op '{}' (expected sum, avg, max, min or prod)", name));
}

}  // namespace torus
