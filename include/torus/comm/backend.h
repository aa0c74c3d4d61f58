// torus/comm/backend.h — the buffer-level transport interface.
//
// A Backend is one communicator of one transport (mpi, ofi, nccl) over one
// group of ranks. It works on raw buffers (pointer, element count, dtype) —
// no LibTorch here — and every op is asynchronous: it returns a Work that the
// backend's progress engine completes. ProcessGroup is the tensor-facing layer
// above it and has already validated arguments; a backend still rejects what
// it cannot serve with InvalidArgument/Unsupported before communicating.
//
// Contracts common to all ops:
//  * Ordering: ops on one Backend are matched across ranks in issue order;
//    every rank of the group must issue the same collectives in the same
//    order. Ops may be issued from any thread (the backend serialises them).
//  * Buffers: device buffers when device_type() says so, else host memory.
//    They must stay valid until the Work completes (Note [Work lifetime]).
//    Send and receive buffers may be the same pointer (in place); see each op.
//  * Deadlines: Note [Deadlines] in work.h. `timeout` must be > 0 here.
//  * Capability: supports() says whether an (op, dtype, reduce op) is served;
//    an op outside it throws Unsupported without communicating.
//  * Thread safety: all methods are thread safe.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "torus/comm/types.h"
#include "torus/comm/work.h"
#include "torus/core/dtype.h"

namespace torus::comm {

class Store;

// Identity of a group, the same on every backend of that group.
struct GroupInfo {
  std::string name;             // "world", "tp", "dp", "pp+dp", user names...
  int rank = 0;                 // this process's rank in the group
  int size = 1;
  std::vector<int> global_ranks;  // global_ranks[group rank] = world rank
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;  // "mpi", "ofi", "nccl"
  virtual DeviceType device_type() const = 0;
  virtual const GroupInfo& group() const = 0;
  int rank() const { return group().rank; }
  int size() const { return group().size; }

  virtual bool supports(OpType op, DType dtype, ReduceOp reduce = ReduceOp::kSum) const = 0;

  // out[i] = reduce over ranks of in[i], i < count. in == out is in place.
  // kAvg divides the sum by size() (integers: truncating division).
  virtual WorkPtr all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                             Duration timeout) = 0;

  // `in` holds size()*count elements; out receives the reduction of block
  // rank() (count elements). In place when out == (char*)in + rank()*count*elt.
  virtual WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                 Duration timeout) = 0;

  // `in` holds count elements; out receives size()*count elements, block r
  // from rank r. In place when in == (char*)out + rank()*count*elt.
  virtual WorkPtr all_gather(const void* in, void* out, size_t count, DType dtype, Duration timeout) = 0;

  // send_counts[r] elements of `in` (packed in rank order) go to rank r;
  // recv_counts[r] elements from rank r land in `out` (packed in rank order).
  // Counts must agree pairwise across ranks. in must not alias out.
  virtual WorkPtr all_to_all(const void* in, void* out, std::span<const size_t> send_counts,
                             std::span<const size_t> recv_counts, DType dtype, Duration timeout) = 0;

  // Copies count elements of root's buf into buf on every rank.
  virtual WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Duration timeout) = 0;

  // out on root receives the reduction; out is untouched elsewhere (may be
  // null there). in == out is in place.
  virtual WorkPtr reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root,
                         Duration timeout) = 0;

  // Point to point; messages between a pair with the same tag are
  // non-overtaking. tag >= 0.
  virtual WorkPtr send(const void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) = 0;
  virtual WorkPtr recv(void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) = 0;

  virtual WorkPtr barrier(Duration timeout) = 0;

  // Collective over this group: every rank calls it. Ranks with the same
  // color >= 0 form a new group ordered by (key, rank); color < 0 returns
  // nullptr. `name` names the new group. Blocks until the new communicator is
  // ready or `timeout` passes (TimeoutError).
  virtual std::shared_ptr<Backend> split(int color, int key, const std::string& name, Duration timeout) = 0;

  // Marks the group broken: in-flight ops fail with CommError, later ops fail
  // at once. Never blocks on peers. Idempotent.
  virtual void abort(const std::string& reason) = 0;
};

using BackendPtr = std::shared_ptr<Backend>;

}  // namespace torus::comm
