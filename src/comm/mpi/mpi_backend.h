// Private: the `mpi` host backend — one Backend per MPI communicator, over
// Open MPI's non-blocking collectives, driven by the process's MpiRuntime.
//
// Contracts beyond backend.h:
//  * Host memory only (device_type() is kCPU). Every (op, dtype, reduce op)
//    of types.h is supported.
//  * Counts: MPI takes int counts. An op whose whole buffer (for
//    reduce_scatter/all_gather: size()*count; for all_to_all: the sum of the
//    counts) exceeds INT_MAX elements throws Unsupported before
//    communicating; split it. A count whose byte size overflows size_t
//    throws InvalidArgument.
//  * f16/bf16 reductions (all_reduce, reduce_scatter, reduce) are staged in
//    f32: converted on the calling thread, reduced by MPI in f32, rounded
//    once into the output on the progress thread. Data movement moves them as
//    16-bit words. kAvg is a sum divided by size() afterwards (integers
//    truncate).
//  * In place: all_reduce and reduce take in == out (MPI_IN_PLACE);
//    all_gather takes in == out + rank*count (MPI_IN_PLACE); reduce_scatter
//    takes out == in + rank*count (through a temporary, so the other blocks
//    of `in` are left unchanged). Partially overlapping buffers are undefined.
//  * all_to_all is always MPI_Ialltoallv, equal splits included, so that
//    every rank of the group starts the same MPI call whatever its own
//    counts (all zero, all equal or uneven).
//  * recv fails with CommError if the matched message holds a different
//    number of elements than `count`.
//  * A group of one rank completes collectives at once (copying in to out);
//    send/recv to oneself go through MPI.
//  * Issue calls never block on peers (they may convert f16/bf16 inputs);
//    split() blocks (see below). Thread safe; ops are matched in issue order.
//  * Works complete on the MPI progress thread: Work::on_complete callbacks
//    run there and must not wait on other ops (nothing would progress them);
//    split() refuses to run there (InvalidArgument).
//  * After a deadline passes or abort(), the group is broken: ops issued
//    later return a Work already failed with CommError.
//  * Destroying the backend never blocks: its communicator is freed on the
//    progress thread once nothing is pending on it, or left to
//    MPI_Finalize if a request was abandoned (mpi_runtime.h).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "comm/mpi/mpi_runtime.h"
#include "torus/comm/backend.h"
#include "torus/comm/context.h"

namespace torus::comm {

// The world backend: group "world", a duplicate of MPI_COMM_WORLD (made with
// MPI_Comm_idup under init.timeout, default 10 min). Collective over the job;
// blocks until every rank has called it. Starts the MPI runtime if needed.
// Throws InvalidArgument if init.launch (when given) disagrees with MPI about
// this process's rank or the world size; CommError/TimeoutError if MPI cannot
// start or peers do not arrive. init.store and init.hosts are not used.
BackendPtr create_mpi_world_backend(const BackendInit& init);

namespace mpi {

class MpiBackend final : public Backend {
 public:
  MpiBackend(std::shared_ptr<MpiRuntime> runtime, std::shared_ptr<MpiComm> comm);
  ~MpiBackend() override;
  MpiBackend(const MpiBackend&) = delete;
  MpiBackend& operator=(const MpiBackend&) = delete;

  std::string_view name() const override { return "mpi"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  const GroupInfo& group() const override { return comm_->group(); }
  bool supports(OpType op, DType dtype, ReduceOp reduce = ReduceOp::kSum) const override;

  WorkPtr all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, Duration timeout) override;
  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op, Duration timeout) override;
  WorkPtr all_gather(const void* in, void* out, size_t count, DType dtype, Duration timeout) override;
  WorkPtr all_to_all(const void* in, void* out, std::span<const size_t> send_counts,
                     std::span<const size_t> recv_counts, DType dtype, Duration timeout) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Duration timeout) override;
  WorkPtr reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root,
                 Duration timeout) override;
  WorkPtr send(const void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) override;
  WorkPtr recv(void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) override;
  WorkPtr barrier(Duration timeout) override;

  // Ranks first meet in an MPI_Ibarrier on this group, bounded by `timeout`
  // (a missing peer gives TimeoutError and breaks this group, not a hang);
  // then the progress thread calls the blocking MPI_Comm_split, which by then
  // only waits for peers that have already arrived. Blocks the caller until
  // the new group is ready. Takes a sequence number of this group. As with
  // MPI itself, concurrent splits of overlapping groups from different
  // threads can deadlock (each progress thread blocked in its own
  // MPI_Comm_split): create groups from one thread.
  std::shared_ptr<Backend> split(int color, int key, const std::string& name, Duration timeout) override;

  void abort(const std::string& reason) override;

 private:
  struct Spec {
    std::function<int(MPI_Request*)> start;
    std::function<void(const MPI_Status&)> finish;
    bool cancellable = false;
    int tag = -1;  // send/recv, for the timeout message
  };
  WorkInfo make_info(OpType op, DType dtype, std::vector<int64_t> sizes, int peer = -1) const;
  // Assigns the sequence number and queues the op; a broken group gives a
  // failed Work. `label(seq)`, if given, replaces WorkInfo::describe() in
  // messages.
  std::shared_ptr<MpiWork> issue(WorkInfo info, Duration timeout, Spec spec,
                                 const std::function<std::string(uint64_t)>& label = {});
  // Group of one rank: assigns the sequence number and runs `local` now.
  WorkPtr issue_local(WorkInfo info, const std::function<void()>& local);
  // CommError for `what` issued on a broken group.
  std::exception_ptr broken_error(const std::string& what) const;

  std::shared_ptr<MpiRuntime> runtime_;
  std::shared_ptr<MpiComm> comm_;
  std::mutex mu_;          // orders seq assignment with submission
  uint64_t next_seq_ = 1;  // guarded by mu_
};

}  // namespace mpi
}  // namespace torus::comm
