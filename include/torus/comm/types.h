// torus/comm/types.h — vocabulary shared by every comm layer: reduce ops
// (torus::ReduceOp, core/reduce_op.h, re-exported here), op kinds and the
// per-op options structs.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

#include "torus/core/reduce_op.h"

namespace torus::comm {

using ::torus::kAllReduceOps;
using ::torus::reduce_op_from_name;
using ::torus::reduce_op_name;
using ::torus::ReduceOp;

enum class OpType : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kAllToAll,
  kBroadcast,
  kReduce,
  kSend,
  kRecv,
  kBarrier,
};
inline constexpr OpType kAllOpTypes[] = {OpType::kAllReduce, OpType::kReduceScatter, OpType::kAllGather,
                                         OpType::kAllToAll,  OpType::kBroadcast,     OpType::kReduce,
                                         OpType::kSend,      OpType::kRecv,          OpType::kBarrier};

std::string_view op_type_name(OpType op);         // "all_reduce", ...
OpType op_type_from_name(std::string_view name);  // throws InvalidArgument

// A duration of zero in any options struct means "use the group's default"
// (ProcessGroup::timeout(), itself defaulting to TORUS_TIMEOUT_MS / 10 min).
using Duration = std::chrono::milliseconds;
inline constexpr Duration kDefaultTimeout{0};

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  Duration timeout = kDefaultTimeout;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  Duration timeout = kDefaultTimeout;
};
struct AllGatherOptions {
  Duration timeout = kDefaultTimeout;
};
// Uneven splits: counts in elements of the first dimension (ProcessGroup) or
// in elements (Backend). Empty vectors mean equal splits.
struct AllToAllOptions {
  std::vector<int64_t> input_split_sizes;
  std::vector<int64_t> output_split_sizes;
  Duration timeout = kDefaultTimeout;
};
struct BroadcastOptions {
  int root = 0;
  Duration timeout = kDefaultTimeout;
};
struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  Duration timeout = kDefaultTimeout;
};
struct SendRecvOptions {
  int tag = 0;
  Duration timeout = kDefaultTimeout;
};
struct BarrierOptions {
  Duration timeout = kDefaultTimeout;
};

}  // namespace torus::comm
