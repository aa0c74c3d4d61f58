// Private: the WorkInfo of an op on a group, filled the same way by every
// backend (mpi, ofi, nccl, neuron).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "torus/comm/backend.h"

namespace torus::comm {

// seq 0: the backend numbers the op itself.
inline WorkInfo make_work_info(const GroupInfo& g, OpType op, DType dtype, std::vector<int64_t> sizes, int peer = -1,
                               uint64_t seq = 0) {
  WorkInfo w;
  w.seq = seq;
  w.op = op;
  w.group = g.name;
  w.rank = g.rank;
  w.group_size = g.size;
  w.dtype = dtype;
  w.sizes = std::move(sizes);
  w.peer = peer;
  return w;
}

}  // namespace torus::comm
