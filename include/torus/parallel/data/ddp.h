// torus/parallel/data/ddp.h — data parallelism for any torch::nn::Module.
//
//   torus::dp::DistributedDataParallel ddp(model, groups);
//   for (...) {
//     auto loss = model->loss(x, y);
//     loss.backward();        // buckets all-reduce while backward runs
//     optimizer.step();       // gradients are already averaged over dp
//     ddp.zero_grad();
//   }
//
// Gradients live in flat buckets (25 MB by default, a smaller first one); each
// parameter's .grad is a view into its bucket. A post-accumulation hook on
// every parameter counts the gradients a bucket still waits for; when a bucket
// is complete its all-reduce starts at once (buckets start in bucket order on
// every rank), overlapping communication with the rest of backward. At the end
// of backward (finish_in_backward) or at finish_grad_sync() every bucket is
// waited for and scaled, so the optimizer step sees reduced gradients. "The
// end of backward" is the outermost backward's: a hook that fires inside an
// inner backward (activation recompute's replay) queues the finish on the
// outer one (parallel::queue_after_backward, Note [Inner backward]).
//
// Which group reduces which gradient:
//  * ordinary parameters: over `groups.dp` (average or sum);
//  * parameters whose ShardSpec has tp_partial_grad (replicated over TP but
//    only partially differentiated on each TP rank, e.g. LayerNorm under
//    sequence parallelism): SUM over TP and average/sum over dp in one
//    all-reduce over `groups.dp_tp`, even when dp has one rank;
//  * TP-sharded parameters are reduced over dp like any other: every dp peer
//    holds the same shard.
// Groups of one rank are skipped: a model with nothing to reduce costs nothing.
//
// Gradient accumulation: inside no_sync() backward only accumulates into the
// buckets; the next backward outside it reduces the sum. A parameter whose
// gradient was never produced reduces its zeros (every rank must agree on the
// buckets, so nothing is skipped).
//
// Note [Main gradients]: with DDPOptions::grad_dtype = f32 a bf16/f16
// parameter's gradient is accumulated in an f32 bucket slice instead of its
// .grad: the post-accumulation hook adds each fresh .grad (computed by
// autograd in the parameter's dtype) into the slice and resets .grad, so
// micro-batch sums and the reduction keep f32 precision. grad(p) returns the
// slice (the GradSync seam); the optimizer and clipping read gradients
// through it. Parameters of the bucket dtype are views as before.
//
// Contracts: one backward at a time; the wrapper must outlive every backward
// it hooks (its destructor removes the hooks). The optimizer may set grads to
// None (zero_grad(set_to_none)); the next backward restores the bucket views.
// Communication errors propagate out of backward()/finish_grad_sync() as
// torus::CommError / TimeoutError.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <string>
#include <vector>

#include "torus/parallel/data/buckets.h"
#include "torus/parallel/data/grad_sync.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/sharding.h"

namespace torch::nn {
class Module;
}
namespace torch::autograd {
struct Node;
}

namespace torus::dp {

struct DDPOptions {
  int64_t bucket_cap_bytes = 25LL << 20;
  int64_t first_bucket_cap_bytes = 1LL << 20;
  bool average = true;               // average over dp (false: sum)
  bool overlap = true;               // start buckets from backward hooks as they fill
  bool finish_in_backward = true;    // wait for every bucket when backward ends
  bool broadcast_parameters = true;  // copy dp rank 0's parameters at construction
  // CPU buckets live in shared host memory (comm::shared_host_zeros), so
  // that the ofi backend's same-host all_reduce reads and writes the peers'
  // buckets directly (Note [Zero-copy host ops]); other backends are not
  // affected. With false they are ordinary tensors: still shared memory
  // where the shared host allocator is installed (Note [Shared host
  // allocator]), ordinary heap memory where it is not.
  bool shared_host_buckets = true;
  // Gradient buffers in this dtype for floating-point parameters of another
  // dtype (f32 main gradients of bf16/f16 parameters, accumulated over the
  // micro-batches and reduced in f32; Note [Main gradients]); unset: each
  // parameter's own dtype. Such parameters get buckets even where nothing is
  // reduced (a group of one rank): local buckets, never communicated.
  std::optional<c10::ScalarType> grad_dtype;
};

// One parameter handed to the wrapper.
struct NamedParameter {
  std::string name;
  at::Tensor tensor;   // a leaf that requires grad (others are ignored)
  tp::ShardSpec spec;  // replicated by default
};

// DistributedDataParallel is the engine's GradSync (grad_sync.h) for plain
// data parallelism: set_sync_enabled / start / finish / clear_grads map to
// set_grad_sync_enabled / start_grad_sync / finish_grad_sync /
// zero_grad(set_to_none = true); grad(p) is p's bucket view (p.grad()).
class DistributedDataParallel : public GradSync {
 public:
  // Wraps every parameter of `module` (specs from tp::collect_shard_specs).
  // Collective over dp when broadcast_parameters (and dp has > 1 rank).
  // Throws InvalidArgument when a tp_partial_grad parameter needs groups.dp_tp
  // and it is missing.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, const parallel::ParallelGroups& groups,
                          const DDPOptions& options = {});
  // Wraps an explicit parameter list (the Python binding's entry point).
  DistributedDataParallel(std::vector<NamedParameter> params, const parallel::ParallelGroups& groups,
                          const DDPOptions& options = {});
  ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

  // Starts the collective of every bucket not started yet (all of them when
  // overlap is off). Non-blocking. No-op while sync is disabled.
  void start_grad_sync();
  // Starts what is left, waits for every bucket and finishes it; afterwards
  // the gradients are reduced. A no-op when nothing happened since the last
  // synchronisation (no gradient produced, no start_grad_sync): calling it
  // after a backward that already finished (finish_in_backward) is harmless.
  void finish_grad_sync();

  // Zeroes every bucket (and the grads of parameters outside buckets), or,
  // with set_to_none, sets every parameter's .grad to None instead. Then
  // the next backward lets autograd hand over each fresh gradient and the
  // ready hook copies it into its bucket (one pass over the gradients),
  // where zeroing costs a pass and accumulating into the zeroed view
  // another one that reads twice. Between zero_grad(true) and the next
  // backward the parameters have no .grad; afterwards they are bucket
  // views again (a parameter that got no gradient reads as zeros).
  void zero_grad(bool set_to_none = false);

  // Gradient accumulation: while disabled, backward only accumulates.
  void set_grad_sync_enabled(bool enabled);
  bool grad_sync_enabled() const { return sync_enabled_; }
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.grad_sync_enabled()) {
      ddp_.set_grad_sync_enabled(false);
    }
    ~NoSyncGuard() { ddp_.set_grad_sync_enabled(previous_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Copies dp rank 0's parameter values to every dp rank (collective over
  // dp; over dp_tp for tp_partial_grad parameters is not needed: they are
  // equal over TP by construction).
  void broadcast_parameters();

  // Replaces the collective step (e.g. a ZeRO reduce-scatter). Not while a
  // synchronisation is in flight.
  void set_reducer(std::unique_ptr<BucketReducer> reducer);

  const std::vector<Bucket>& buckets() const { return buckets_; }

  // GradSync.
  void set_sync_enabled(bool enabled) override { set_grad_sync_enabled(enabled); }
  void start() override { start_grad_sync(); }
  void finish() override { finish_grad_sync(); }
  void clear_grads() override { zero_grad(/*set_to_none=*/true); }
  at::Tensor grad(const at::Tensor& param) const override;
  comm::ProcessGroupPtr reduce_group(const at::Tensor& param) const override;

  struct Stats {
    int64_t syncs = 0;                        // completed synchronisations
    int64_t buckets_started_in_backward = 0;  // started from hooks (overlapped)
    int64_t buckets_started_late = 0;         // started by start/finish_grad_sync
    int64_t grads_restored = 0;               // grads found replaced and copied back into a bucket
  };
  Stats stats() const;

 private:
  void init(std::vector<NamedParameter> params);
  c10::ScalarType grad_dtype_of(const at::Tensor& param) const;
  void on_grad_ready(size_t slot_index);
  void start_ready_buckets_locked();
  void start_bucket_locked(Bucket& bucket, bool from_hook);
  void start_all_locked();
  void reset_iteration_locked();

  std::shared_ptr<torch::nn::Module> module_;
  parallel::ParallelGroups groups_;
  DDPOptions options_;
  std::unique_ptr<BucketReducer> reducer_;

  std::vector<Bucket> buckets_;
  struct SlotRef {
    int bucket = 0;
    int slot = 0;
  };
  std::vector<SlotRef> slot_refs_;                                    // by hook index
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive (hooks live there)
  std::vector<uintptr_t> hook_keys_;
  std::vector<at::Tensor> unbucketed_;  // params reduced by nobody (groups of one)
  std::unordered_map<const void*, SlotRef> by_param_;  // TensorImpl -> its slot

  mutable std::mutex mu_;
  bool sync_enabled_ = true;
  bool callback_queued_ = false;
  bool iteration_active_ = false;  // a gradient was produced (or a sync started) since the last finish
  size_t next_to_start_ = 0;
  Stats stats_;
};

}  // namespace torus::dp
