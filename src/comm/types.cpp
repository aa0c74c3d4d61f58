#include "torus/comm/types.h"

#include "core/log.h"

namespace torus::comm {

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

std::string_view op_type_name(OpType op) {
  switch (op) {
    case OpType::kAllReduce: return "all_reduce";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kAllGather: return "all_gather";
    case OpType::kAllToAll: return "all_to_all";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kReduce: return "reduce";
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
    case OpType::kBarrier: return "barrier";
  }
  return "?";
}

ReduceOp reduce_op_from_name(std::string_view name) {
  for (ReduceOp op : kAllReduceOps) {
    if (reduce_op_name(op) == name) return op;
  }
  throw InvalidArgument(fmt::format("unknown reduce op '{}' (expected sum, avg, max, min or prod)", name));
}

OpType op_type_from_name(std::string_view name) {
  for (OpType op : kAllOpTypes) {
    if (op_type_name(op) == name) return op;
  }
  throw InvalidArgument(fmt::format("unknown op '{}'", name));
}

}  // namespace torus::comm
