#include "torus/comm/types.h"

#include "core/log.h"

namespace torus::comm {

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

OpType op_type_from_name(std::string_view name) {
  for (OpType op : kAllOpTypes) {
    if (op_type_name(op) == name) return op;
  }
  throw InvalidArgument(fmt::format("unknown op '{}'", name));
}

}  // namespace torus::comm
