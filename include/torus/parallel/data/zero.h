// torus/parallel/data/zero.h — ZeRO stages 1-3 over the data-parallel group:
// the engine's GradSync (grad_sync.h) when optimizer state, gradients and
// parameters are sharded.
//
//   dp::Zero zero(params, groups, {.stage = 2});
//   std::vector<optim::ParamGroup> groups = ...;   // over zero.segments()' values
//   ... backward (hooks reduce-scatter the gradients into shards) ...
//   zero.start(); zero.finish();                   // every shard gradient reduced
//   clip over the segments, optimizer->step();     // updates this rank's shard only
//   zero.publish_parameters();                     // stages 1-2: all-gather the new parameters
//   zero.clear_grads();
//
// Note [ZeRO units]: the parameters are grouped into units — one per
// (block, reduce group) at stages 2-3, one per reduce group at stage 1 —
// each with one flat buffer padded to a multiple of
// its group's size N. Rank r of the group owns the element range
// [r L/N, (r+1) L/N) of the unit's flat buffer: its shard. A shard is cut on
// element ranges, not on parameters; the pieces of parameters inside it are
// the segments (ZeroSegment), and the optimizer updates segments, so weight
// decay and any other per-parameter option apply per parameter, never per
// shard. The reduce group of a unit is the group its gradients are reduced
// over: dp for ordinary and TP-sharded parameters, dp x tp for parameters
// whose gradients are partial over TP (sequence-parallel norms) — their
// shards are cut over dp x tp.
//
// What each stage keeps (Ψ parameters of this rank's model replica, N ranks,
// bf16/f16 parameters with fp32 masters and Adam):
//   stage 1: parameters 2Ψ (views of the units' flat buffers), gradients
//            accumulated in full buffers (4Ψ f32 main gradients, 2Ψ with
//            grads in the parameter dtype), reduce-scattered once per step
//            into shards; masters and Adam state 12Ψ/N.
//   stage 2: + gradients: each micro-batch's gradients of a unit are copied
//            into a transient full buffer as they complete, reduce-scattered,
//            and accumulated into the persistent shard (Note [ZeRO-2 and
//            micro-batches]); at most max_inflight transient buffers live.
//   stage 3: + parameters: only the shard (2Ψ/N) stays; a block's flat
//            buffer is all-gathered before the block runs — in forward and
//            again in backward — the next one prefetched, and its storage
//            released right after use (Note [Freeing that really frees]).
//            Parameters outside blocks (embeddings, final norm, head) stay
//            gathered through the step.
//
// Note [ZeRO-2 and micro-batches]: a gradient accumulated over m
// micro-batches cannot stay sharded without reducing every micro-batch's
// part: stage 2 and 3 reduce-scatter each unit once per micro-batch backward
// (m x the reduce-scatter traffic of stage 1, which reduces the accumulated
// full buffer once) and keep the sum in the shard. Stage 1 keeps the full
// gradient (the memory stage 2 saves) and reduces once. A unit is reduced
// when every one of its parameters has produced a gradient since its last
// reduction; whatever arrives later in the step (split backward's deferred
// weight gradients) is reduced by the next reduction or by finish(), so the
// sum is exact whatever the schedule.
//
// Note [Freeing that really frees]: autograd keeps views of parameters
// (at::linear saves weight.t()); freeing a parameter tensor would not free
// memory those views keep. Each unit's parameters are views of one flat
// buffer, and stage 3 releases the buffer's storage itself (its bytes go
// back to the allocator; every view, saved or not, sees no data), and
// re-materialises the same storage when it gathers again.
//
// Contracts: the same as GradSync's. grad(p) is undefined for parameters
// in units (their gradients are segments, ZeroSegment::grad); parameters
// that no unit holds are not handled here (the engine keeps tied copies
// across pipeline stages in a DDP). The optimizer must read segments only,
// and publish_parameters() must follow every step that updated them.
// Stage 3: a parameter's tensor holds no data outside a gathered window
// (forward/backward of its block, or gather_all() / release_all()).
#pragma once

#include <ATen/core/Tensor.h>

#include "torus/parallel/data/offload.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "torus/comm/process_group.h"
#include "torus/parallel/block_hooks.h"
#include "torus/parallel/data/grad_sync.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/sharding.h"

namespace torch::autograd {
struct Node;
}

namespace torus::dp {


struct ZeroOptions {
  int stage = 1;  // 1, 2 or 3
  bool average = true;  // average over dp (false: sum)
  // Gradient buffers in this dtype for parameters of another floating dtype
  // (f32 main gradients of bf16/f16 parameters); unset: the parameter's.
  std::optional<c10::ScalarType> grad_dtype;
  Offload offload = Offload::kNone;
  int max_inflight = 2;  // stages 2-3: reduce-scatters in flight before the oldest is waited for
  int prefetch = 1;      // stage 3: blocks gathered ahead of the one running
  // Construction without the whole model (Note [Deferred initialisation] in
  // sharding.h): when set and it returns true, it has written the values of
  // a parameter whose storage holds nothing yet into the unit's buffer
  // (`out`); otherwise the parameter's own values are copied. Used during
  // construction only.
  std::function<bool(const at::Tensor& param, at::Tensor& out)> materialize;
};

struct ZeroParameter {
  std::string name;
  at::Tensor tensor;  // a leaf that requires grad
  tp::ShardSpec spec;
  int64_t block = -1;  // stages 2-3: a unit per block (stage 3 gathers it); -1: outside blocks
  bool weight_decay = true;
};

// One piece of one parameter inside this rank's shard.
struct ZeroSegment {
  std::string name;    // the parameter's global name
  int param = 0;       // index into the constructor's parameter list
  int64_t offset = 0;  // first element within the parameter's (TP shard's) flattened elements
  int64_t numel = 0;
  // What the optimizer updates, 1-D, in the parameter's dtype: a view of
  // the unit's parameter shard (on the host with offload). The optimizer's
  // fp32 master of a half-precision segment is the ZeRO master.
  at::Tensor value;
  at::Tensor grad;  // 1-D: the reduced gradient (valid after finish())
  bool weight_decay = true;
  // Counted by the global gradient norm on this rank: every element of a
  // model replica lies in exactly one shard of one dp (or dp x tp) rank;
  // parameters replicated over TP and sharded over dp are counted on TP
  // rank 0 only.
  bool counted = true;
  std::vector<int64_t> shard_shape;  // the parameter's (TP shard's) shape
  tp::ShardSpec spec;
  // "name[offset:offset+numel]": the key of the segment's optimizer state.
  std::string key() const;
};

class Zero : public GradSync, public parallel::BlockHooks {
 public:
  // Not collective: every dp replica holds the same parameter values
  // (layout-independent init), so nothing is broadcast. Throws
  // InvalidArgument for a bad stage, a parameter that is not a leaf or does
  // not require grad, a tp_partial_grad parameter without groups.dp_tp, and
  // offload other than none at stage < 1 or optimizer+params below stage 3.
  Zero(std::vector<ZeroParameter> params, const parallel::ParallelGroups& groups, ZeroOptions options);
  ~Zero() override;
  Zero(const Zero&) = delete;
  Zero& operator=(const Zero&) = delete;

  int stage() const { return options_.stage; }
  const ZeroOptions& options() const { return options_; }
  const std::vector<ZeroSegment>& segments() const { return segments_; }
  bool holds(const at::Tensor& param) const;
  // True when the parameter's values live only in shards outside gathered
  // windows (stage 3 blocks): its state is then this rank's segment.
  bool param_sharded(const at::Tensor& param) const;
  // This rank's segment of the parameter, or null when its shard holds none.
  const ZeroSegment* segment_of(const at::Tensor& param) const;
  // After new values were written into parameters (kept-gathered units) or
  // segment values (sharded ones): makes the other copy agree (host mirrors
  // with offload). Not collective.
  void after_load();

  // GradSync.
  void set_sync_enabled(bool enabled) override;
  void start() override;
  void finish() override;
  void clear_grads() override;
  at::Tensor grad(const at::Tensor& param) const override;
  comm::ProcessGroupPtr reduce_group(const at::Tensor& param) const override;

  // After the optimizer updated the segments: copies host shards back to the
  // device (offload) and, at stages 1-2, all-gathers every unit (collective
  // over each unit's group). Stage 3 gathers on demand.
  void publish_parameters();

  // Stage 3: materialises every unit (collective), so that the parameters
  // can be read (gathered weights, checkpoints), and releases them again.
  // No-ops at stages 1-2.
  void gather_all();
  void release_all();

  // BlockHooks (stage 3 installs itself on the model's stages).
  at::Tensor run_block(int64_t layer, const at::Tensor& x, const parallel::BlockFn& run) override;

  // Bytes this rank keeps, by kind (the persistent buffers; transient
  // buffers are reported by peak_transient_bytes).
  struct Memory {
    int64_t numel = 0;           // parameter elements in units (Ψ of this rank's chunk, unpadded)
    int64_t param_full = 0;      // full flat parameter buffers kept: every unit at stages 1-2, units outside blocks at 3
    int64_t param_shards = 0;    // stage 3: the blocks' parameter shards
    int64_t grad_full = 0;       // stage 1: full gradient buffers
    int64_t grad_shards = 0;     // gradient shards
    int64_t gathered_peak = 0;   // stage 3: most bytes of gathered block buffers at once
    int64_t transient_peak = 0;  // stages 2-3: most bytes of transient full gradient buffers at once
  };
  Memory memory() const;

  struct Stats {
    int64_t reduce_scatters = 0;
    int64_t all_gathers = 0;
    int64_t reduce_scatter_bytes = 0;  // input bytes of this rank's reduce-scatters (the full unit buffers)
    int64_t all_gather_bytes = 0;      // output bytes of its all-gathers
    int64_t prefetch_hits = 0;  // stage 3: a block's gather was already in flight when it was needed
    double comm_wait_seconds = 0;  // time spent waiting for collectives
  };
  Stats stats() const;

 private:
  struct Unit;
  void init(std::vector<ZeroParameter> params);
  void on_grad_ready(size_t param_index);
  void flush_locked(Unit& u);
  void complete_locked(Unit& u);
  void drain_locked(size_t keep);
  void ensure_grad_full(Unit& u);
  void gather_start(Unit& u);
  void gather_wait(Unit& u);
  void release(Unit& u);
  Unit* unit_of_block(int64_t layer);
  void prefetch_after(int64_t layer, int direction);

  parallel::ParallelGroups groups_;
  ZeroOptions options_;
  std::vector<ZeroParameter> params_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<std::pair<int, int64_t>> place_;  // by parameter: (unit, element offset in the flat buffer)
  std::unordered_map<const void*, int> by_param_;
  std::vector<ZeroSegment> segments_;
  std::vector<int64_t> block_order_;  // blocks in forward order
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  std::vector<Unit*> inflight_;  // reduce-scatters started, oldest first

  mutable std::mutex mu_;
  bool sync_enabled_ = true;
  int64_t gathered_bytes_ = 0;
  int64_t transient_bytes_ = 0;
  Memory memory_;
  Stats stats_;
};

}  // namespace torus::dp
