// torus/comm/process_group.h — the tensor-level process group.
//
// A ProcessGroup is the first LibTorch-facing comm type. It takes at::Tensor
// arguments, validates them (contiguous, supported dtype, device, sizes) and
// throws InvalidArgument before any communication on bad input; it keeps the
// tensors alive in the returned Work until the op completes (Note [Work
// lifetime]); and it forwards to the backend serving the tensors' device:
// the host backend (mpi or ofi) for CPU tensors, the device backend (nccl)
// for CUDA tensors when built with it.
//
// Every op is asynchronous and returns a Work; call wait() before reading the
// output or reusing the input. Ops of one group must be issued in the same
// order on every rank. Methods are thread safe.
//
// Timeouts: Note [Deadlines] (work.h). A zero timeout in an options struct
// means the group's timeout(), which defaults to TORUS_TIMEOUT_MS (10 min).
//
// Debug mode (TORUS_DEBUG_COLLECTIVES=1, or set_debug(true)): before each op
// the ranks exchange a fingerprint (op, dtype, sizes, root) and every rank
// throws an InvalidArgument naming the first rank whose fingerprint differs,
// instead of hanging or corrupting data. It costs one small all_gather per op.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "torus/comm/backend.h"
#include "torus/comm/context.h"
#include "torus/comm/types.h"
#include "torus/comm/work.h"

namespace torus::comm {

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // `host` serves CPU tensors; `device` (may be null) serves device tensors.
  ProcessGroup(std::shared_ptr<Context> context, BackendPtr host, BackendPtr device = nullptr);

  int rank() const { return info().rank; }
  int size() const { return info().size; }
  const std::string& name() const { return info().name; }
  const GroupInfo& info() const { return host_->group(); }
  // World rank of a group rank.
  int global_rank(int group_rank) const;
  const std::shared_ptr<Context>& context() const { return context_; }
  const BackendPtr& host_backend() const { return host_; }
  const BackendPtr& device_backend() const { return device_; }

  Duration timeout() const { return timeout_; }
  void set_timeout(Duration timeout);  // > 0
  bool debug() const { return debug_; }
  void set_debug(bool on) { debug_ = on; }

  // In place: tensor = reduce over ranks.
  WorkPtr all_reduce(at::Tensor& tensor, const AllReduceOptions& opts = {});
  // Out of place: output (same shape/dtype) = reduce over ranks of input.
  WorkPtr all_reduce(const at::Tensor& input, at::Tensor& output, const AllReduceOptions& opts = {});

  // input: size()*N elements (any shape); output: N elements, the reduction of
  // block rank(). In place when output is the rank()'th block of input.
  WorkPtr reduce_scatter(const at::Tensor& input, at::Tensor& output, const ReduceScatterOptions& opts = {});

  // input: N elements; output: size()*N elements, block r from rank r.
  // In place when input is the rank()'th block of output.
  WorkPtr all_gather(const at::Tensor& input, at::Tensor& output, const AllGatherOptions& opts = {});

  // Splits along dim 0. Equal splits by default (dim 0 divisible by size());
  // uneven with input_split_sizes / output_split_sizes (rows per rank).
  WorkPtr all_to_all(const at::Tensor& input, at::Tensor& output, const AllToAllOptions& opts = {});

  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts = {});

  // In place reduce to root: tensor on root receives the reduction; other
  // ranks' tensors are unchanged.
  WorkPtr reduce(at::Tensor& tensor, const ReduceOptions& opts = {});

  WorkPtr send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts = {});
  WorkPtr recv(at::Tensor& tensor, int src, const SendRecvOptions& opts = {});

  WorkPtr barrier(const BarrierOptions& opts = {});

  // Collective over this group (every rank calls): ranks with the same
  // color >= 0 form a group, ordered by (key, rank); color < 0 gets nullptr.
  std::shared_ptr<ProcessGroup> split(int color, int key, const std::string& name);

  // Collective over this group (every rank calls, with the same list): the
  // ranks listed (group ranks, unique) form a new group in list order.
  // Ranks not listed get nullptr.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& name);

  // Marks every backend of the group broken (see Backend::abort).
  void abort(const std::string& reason);

 private:
  const BackendPtr& backend_for(const at::Tensor& t, const char* what) const;
  Duration resolve(Duration d) const { return d.count() > 0 ? d : timeout_; }
  void check_fingerprint(const BackendPtr& b, OpType op, const at::Tensor& t, const std::vector<int64_t>& extra,
                         Duration timeout);

  std::shared_ptr<Context> context_;
  BackendPtr host_;
  BackendPtr device_;
  Duration timeout_;
  bool debug_ = false;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// Maps at::ScalarType onto torus::DType; throws InvalidArgument for types the
// comm layer does not carry (bool, complex, f8...).
DType to_dtype(c10::ScalarType t);
c10::ScalarType to_scalar_type(DType t);
// The name Torus gives a tensor dtype in messages: dtype_name()'s spelling
// (f32, bf16, u8...) and i8, i16, bool, c64... for types outside DType.
std::string scalar_type_name(c10::ScalarType t);

// A zeroed, contiguous CPU tensor over shared host memory (Note [Shared host
// buffers] in shared_host.h): collectives whose buffers are all such tensors
// skip the ofi backend's same-host staging copies. The memory is freed with
// the tensor's storage. Throws InvalidArgument for negative sizes.
at::Tensor shared_host_zeros(at::IntArrayRef sizes, c10::ScalarType dtype);

}  // namespace torus::comm

namespace torus {

// Bootstraps this process (comm::Context::create), installs the shared host
// allocator where comm::maybe_install_shared_host_allocator says so, and
// returns the world group. Collective over the job.
comm::ProcessGroupPtr init(const comm::InitOptions& options = {});

}  // namespace torus
