// Private: the nccl comm backend — torus::comm::Backend over NCCL for CUDA
// device buffers. Free of CUDA and NCCL types, so the bootstrap and the
// ProcessGroup can include it in any translation unit of a CUDA build.
//
// Communicators. The world communicator is built from an NCCL unique id that
// rank 0 creates and publishes through the Store (no MPI involved);
// sub-groups come from ncclCommSplit of their parent (Backend::split). Every
// communicator is created non-blocking (ncclConfig.blocking = 0) so that no
// NCCL call can hang the caller: initialisation, split and every enqueue that
// reports ncclInProgress are polled against the op's deadline.
//
// Note [Stream-ordered work]: each group owns one high-priority
// communication stream, and an op
//   1. records an event on the calling thread's current stream of the
//      group's device (device::current_stream(), set by ProcessGroup from
//      LibTorch's current stream) and makes the comm stream wait on it, so
//      the op reads its inputs after the work queued before it;
//   2. enqueues the NCCL call(s) on the comm stream and records the op's end
//      event there;
//   3. returns a Work that completes when the end event does. Its wait()
//      does not block the host: it makes the calling thread's current stream
//      wait on the end event (so later work on that stream sees the output)
//      and rethrows if the op has already failed. wait(timeout) blocks the
//      host until the op completes, or throws TimeoutError after `timeout`
//      (the op keeps running). barrier()'s Work blocks the host in wait().
// Buffers must stay valid until the Work completes; ProcessGroup keeps the
// tensors alive in the Work (Note [Work lifetime]), and the watchdog releases
// them once the end event has completed.
//
// Failure (watchdog.h): a watchdog thread per group polls the end events and
// ncclCommGetAsyncError. An op past its deadline, an asynchronous error (a
// peer died, the network broke) or abort() breaks the group: the
// communicator is aborted with ncclCommAbort — never destroyed, which could
// hang — and the ops in flight fail (TimeoutError / CommError); later ops
// throw CommError at once. A healthy group's communicator is finalised and
// destroyed when the backend is destroyed, after its ops completed (bounded
// by NcclOptions::shutdown_timeout, then aborted).
//
// Types and ops: all Backend ops, dtypes f32, f64, f16, bf16, i32, i64, u8
// natively (no staging), reduce ops sum, avg, max, min, prod (avg on
// integers truncates, as Backend specifies). all_to_all and
// batch_send_recv are grouped NCCL send/recv calls (ncclGroupStart/End).
// Tags: NCCL has none; point-to-point messages between two ranks match in
// issue order, so both sides must issue them in the same order (the tag is
// checked, then ignored).
//
// Thread safety: all methods are thread safe; ops are issued one at a time.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "torus/comm/backend.h"
#include "torus/comm/context.h"

namespace torus::comm {

struct NcclOptions {
  // How often the watchdog polls end events and asynchronous errors; also
  // the longest time a completed op keeps its buffers alive.
  std::chrono::milliseconds watchdog_poll{5};
  // Bound on finalising a healthy communicator at destruction (then abort).
  std::chrono::milliseconds shutdown_timeout{30000};
};

// Everything needed to build one communicator from a unique id.
struct NcclInit {
  std::shared_ptr<Store> store;
  // Store keys used: "<store_prefix>/unique_id" and "<store_prefix>/readers";
  // unique per communicator and the same on every rank.
  std::string store_prefix;
  int rank = 0;
  int size = 1;
  int device = 0;                  // CUDA device index of this rank
  std::string group_name = "world";
  std::vector<int> global_ranks;   // empty: 0..size-1
  Duration timeout{0};             // init deadline and default op timeout (> 0)
  NcclOptions options;
};

// One op of a grouped point-to-point batch.
struct P2POp {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind = Kind::kSend;
  void* buf = nullptr;  // device memory (read for kSend, written for kRecv)
  size_t count = 0;
  DType dtype = DType::kF32;
  int peer = 0;
};

class NcclBackend final : public Backend {
 public:
  struct Impl;
  explicit NcclBackend(std::unique_ptr<Impl> impl);
  ~NcclBackend() override;

  std::string_view name() const override { return "nccl"; }
  DeviceType device_type() const override { return DeviceType::kCUDA; }
  const GroupInfo& group() const override;
  bool supports(OpType op, DType dtype, ReduceOp reduce = ReduceOp::kSum) const override;

  WorkPtr all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, Duration timeout) override;
  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                         Duration timeout) override;
  WorkPtr all_gather(const void* in, void* out, size_t count, DType dtype, Duration timeout) override;
  WorkPtr all_to_all(const void* in, void* out, std::span<const size_t> send_counts,
                     std::span<const size_t> recv_counts, DType dtype, Duration timeout) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Duration timeout) override;
  WorkPtr reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root,
                 Duration timeout) override;
  WorkPtr send(const void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) override;
  WorkPtr recv(void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) override;
  WorkPtr barrier(Duration timeout) override;
  std::shared_ptr<Backend> split(int color, int key, const std::string& name, Duration timeout) override;
  void abort(const std::string& reason) override;

  // Sends and receives to and from any peers as one grouped NCCL call
  // (pipeline-parallel exchanges, halo exchanges): one Work for all of them,
  // every op progressing concurrently, no ordering deadlock between them.
  // Every rank must issue matching batches. Throws as the single ops do.
  WorkPtr batch_send_recv(std::span<const P2POp> ops, Duration timeout);

  // The CUDA device this group's communicator lives on.
  int device() const;
  // True once the group is broken (Failure above).
  bool broken() const;

 private:
  std::unique_ptr<Impl> impl_;
};

// Builds one communicator (collective over `init.size` ranks; see NcclInit).
// Blocks until the communicator is ready; throws TimeoutError (after
// aborting it) when ranks are missing at the deadline, CommError on an NCCL
// failure, Error when the CUDA device is unusable.
std::shared_ptr<NcclBackend> create_nccl_backend(const NcclInit& init);

// The world backend for the bootstrap (Context): see docs/cuda.md for the
// contract. Selects the CUDA device local_rank % device_count and makes it
// current on the calling thread, creates the world communicator through the
// Store under "torus/nccl/world/<n>" (n counts the calls in this process, the
// same on every rank), logs NCCL's version and the EFA start-up check.
// Collective over the world; init.launch and init.store must be set.
BackendPtr create_nccl_world_backend(const BackendInit& init);

}  // namespace torus::comm
