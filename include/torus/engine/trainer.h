// torus/engine/trainer.h — the training engine: any engine::Model (model.h)
// trained with tensor, sequence, pipeline and data parallelism from one
// DeviceMesh.
//
//   auto world = torus::init();
//   auto model = std::make_shared<torus::engine::GPTModel>(gpt_config);    // a model adapter
//   torus::engine::ParallelLayout layout{.tp = 2, .pp = 2, .dp = 2, .num_micro = 4};
//   torus::engine::Trainer trainer(world, model, layout, optim_config);
//   for (int64_t step = 0; step < steps; ++step) {
//     at::Tensor batch = ...;                    // [global_batch, seq + 1] int64, the same on every rank
//     auto stats = trainer.train_step(batch, lr_schedule.at(step));
//   }
//
// The loop around it (data, LR schedule, evaluation, logs, metrics) is
// run::TrainLoop (train_loop.h); the engine composes the parts through
// their seams and names no model:
//  * the model (model.h): stage modules with global parameter names and
//    shard specs, FLOPs, the cut into stages;
//  * the gradient sync (parallel/data/grad_sync.h): DDP today;
//  * the optimizer (optim/): AdamW etc. over parameter groups, with decay on
//    the parameters the model marks;
//  * clipping by the global norm over pp x ep x tp, each element counted
//    once (optim/clip.h): dense parameters on ep rank 0, experts everywhere.
//
// Layout: the world is a mesh pp x dp x ep x tp (tp innermost). The data
// ranks are dp x ep; MoE models keep one gradient sync for the dense
// parameters (over dp x ep) and one for the experts' (over dp), Note [MoE
// groups] in parallel/expert/moe.h. Each pipeline rank
// holds num_chunks stages (virtual stages; Note [Stage layout] in
// schedule.h).
//
// One training step (train_step):
//  1. The global batch is split into num_micro micro-batches, and each
//     micro-batch over the data ranks (dp x ep; Note [Micro-batch rows]);
//     stage 0 reads the tokens, the last stage the labels.
//  2. The pipeline executor runs the schedule (GPipe, 1F1B, interleaved 1F1B
//     or ZB-H1). Each micro-batch's loss is its mean token loss divided by
//     num_micro, so the step's gradient is that of the mean over the global
//     batch, as in one process.
//  3. Data-parallel gradient synchronisation overlaps the last micro-batches'
//     backward: for every chunk, gradients only accumulate until that
//     chunk's last backward, whose hooks start the reductions while the
//     pipeline goes on; they are waited for after the schedule.
//  4. Parameters a stage holds as a copy of another stage's (tied_to) add
//     their gradients with the owner (one all-reduce per pair of ranks).
//  5. Clipping by the global norm, then one optimizer step. A non-finite
//     norm skips the step on every rank (StepStats::skipped).
//
// Split backward (ZB-H1), Note [Deferred weight gradients] (weight_grad.h):
// forwards run with weight-gradient deferral on, so the input-gradient pass
// records the TP linear layers' weight gradients; the weight-gradient pass
// computes them later.
//
// Errors: every layout and size problem throws InvalidArgument before any
// communication. A failed or dead peer surfaces as CommError / TimeoutError
// from train_step; the trainer is then unusable.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torus/amp/loss_scaler.h"
#include "torus/comm/device_mesh.h"
#include "torus/comm/process_group.h"
#include "torus/parallel/data/zero.h"
#include "torus/parallel/expert/routing_stats.h"
#include "torus/parallel/pipeline/executor.h"
#include "torus/parallel/pipeline/schedule.h"
#include "torus/engine/model.h"
#include "torus/parallel/layout.h"

namespace torus::engine {

// The engine's layout is the one layout value (parallel/layout.h, Note [One
// layout]): mesh sizes, schedule, micro-batches, chunks, ZeRO stage and
// offload. The Trainer resolves dp and micro-batches left at 0 for its world.
using ParallelLayout = parallel::Layout;

struct OptimizerConfig {
  std::string name = "adamw";  // sgd | adam | adamw (optim::make_optimizer)
  double lr = 3e-4;            // used when train_step is given lr < 0
  double weight_decay = 0.1;   // on the parameters the model marks (matrices, embeddings)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double momentum = 0.0;   // sgd
  bool nesterov = false;   // sgd
  double grad_clip = 1.0;  // max global L2 norm; 0: no clipping
};

// Note [Mixed precision in the engine]: the model's parameter dtype decides.
// bf16/f16 parameters get fp32 master weights in the optimizer
// (optim/optimizer.h) and, unless grads_in_param_dtype, f32 main gradients
// accumulated over the micro-batches and reduced in f32 (Note [Main
// gradients] in ddp.h). f16 also scales the loss (amp/loss_scaler.h): the
// last stage backpropagates loss x scale; after the gradient sync the
// gradients are unscaled and checked for inf/NaN on every rank of the world
// (one flag all-reduce: tp, pp and dp at once), and an overflow skips the
// step on every rank — parameters, optimizer state and its step count
// untouched — and backs the scale off. bf16 and f32 use no loss scaling.
struct TrainerOptions {
  int64_t bucket_cap_bytes = 25LL << 20;  // DDP buckets
  bool overlap_grad_sync = true;          // start DP all-reduces during the last backward
  int recv_prefetch = 2;                  // pipeline receives posted ahead
  bool record_trace = false;              // keep the executor's action trace (last step)
  bool grads_in_param_dtype = false;      // half-precision parameters: accumulate gradients in their dtype
  // f16 parameters: dynamic scaling by default; a constant scale with
  // dynamic = false. Ignored for other dtypes.
  amp::LossScalerOptions loss_scaler;
  // LibTorch autocast over the forward (f32 parameters, half activations
  // where autocast chooses): the dtype, or undefined for none.
  std::optional<c10::ScalarType> autocast;
  // ZeRO (the layout's `zero` and `offload`, docs/zero.md), stage 3:
  // blocks gathered ahead of the one running.
  int zero_prefetch = 1;
  // Testing: on this world rank, at this step (1-based), one gradient
  // element is set to inf after the backward (fp16 overflow injection).
  int inject_overflow_rank = -1;
  int64_t inject_overflow_step = -1;
};

struct StepStats {
  int64_t step = 0;      // steps taken so far, this one included
  double loss = 0;       // mean token loss over the global batch
  double grad_norm = 0;  // global norm before clipping
  double clip_coefficient = 1;
  bool skipped = false;         // non-finite gradient norm: no update
  double seconds = 0;           // wall time of train_step on this rank
  double pipeline_seconds = 0;  // of which running the schedule
  double sync_seconds = 0;      // waiting for DP / tied-parameter sync, clipping, the optimizer
  int64_t tokens = 0;           // tokens in the global batch
  int peak_live = 0;            // max micro-batches alive on this rank (executor)
  double loss_scale = 1;        // the scale this step's backward used (f16; 1 otherwise)
  bool overflow = false;        // f16: an inf/NaN gradient on some rank skipped the step
  int64_t skipped_steps = 0;    // steps skipped so far (overflow or non-finite norm)
  // MoE models: the step's routing statistics of every MoE layer (the same
  // on every rank); empty for a dense model.
  ep::RoutingSummary routing;
};

// One tensor of the engine's state and how it lies over the ranks.
struct StateTensor {
  at::Tensor tensor;
  tp::ShardSpec spec;     // the TP layout of a model tensor and of its optimizer state
  bool per_rank = false;  // differs on every rank of a replica (a sharded dropout stream)
  // ZeRO: >= 0 when `tensor` is the 1-D range [flat_offset, flat_offset +
  // numel) of the flattened tensor of shape flat_shape — this rank's TP
  // shard of the parameter (spec) — instead of that whole tensor.
  int64_t flat_offset = -1;
  std::vector<int64_t> flat_shape{};
  // A tied parameter's copy (and its optimizer state): the key of the state
  // it copies ("model.embedding.word.weight"); checkpoints save that once.
  std::string tied_to{};
  // An expert's parameter or its optimizer state: replicated over dp only,
  // not over dp x ep (Note [MoE groups]).
  bool expert = false;
};
using StateDict = std::map<std::string, StateTensor>;

// This rank's share of a global batch: rows[i] is row local_rows(global_batch)[i]
// of the global batch ([local rows, seq + 1] int64 tokens).
struct LocalBatch {
  at::Tensor rows;
  int64_t global_batch = 0;
};

class Trainer {
 public:
  // Collective over `world`: builds the mesh and its groups, the stage
  // modules, the gradient sync and the optimizer. Validates everything
  // first (InvalidArgument, no communication).
  Trainer(comm::ProcessGroupPtr world, std::shared_ptr<const Model> model, ParallelLayout layout,
          OptimizerConfig optim = {}, TrainerOptions options = {});
  virtual ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step on `batch`: [global_batch, seq + 1] int64 tokens
  // (inputs are columns [0, seq), labels [1, seq]), the same tensor on every
  // rank. global_batch must divide into dp x num_micro equal parts and seq
  // fit the model: InvalidArgument before any communication otherwise.
  // `lr` < 0: OptimizerConfig::lr. Collective over the world; returns the
  // same StepStats on every rank (times are this rank's).
  StepStats train_step(const at::Tensor& batch, double lr = -1);

  // The rows of a global batch of `global_batch` rows that this rank's data
  // rank (dp x ep) trains on, in the order a LocalBatch holds them (Note
  // [Micro-batch rows]): a sampler reads only these (TokenSampler::rows_at)
  // instead of the whole batch. The same on every tp and pp rank of a data
  // rank. InvalidArgument when global_batch does not split into dp x
  // num_micro equal parts.
  std::vector<int64_t> local_rows(int64_t global_batch) const;

  // As train_step(batch) where every rank holds only its own rows: the same
  // step, bit for bit.
  StepStats train_step(const LocalBatch& batch, double lr = -1);

  // Mean token loss of `batch` (same shape rules) without gradients: a
  // forward-only schedule (pp::forward_only) run by the pipeline executor.
  // Collective; same value on every rank.
  double evaluate(const at::Tensor& batch);
  double evaluate(const LocalBatch& batch);

  // The logits of `batch` (same shape rules as train_step), without
  // gradients, as evaluate runs it: [global_batch, seq, vocab], gathered
  // over tp and the data ranks, the vocabulary padding cropped, f32 (f64 for
  // f64 models), on the host, the same tensor on every rank. For comparing
  // the model with another implementation: it moves the whole batch's
  // logits to every rank. Collective; Unsupported for a model whose stages
  // do not give logits (StageModule::full_logits).
  at::Tensor logits(const at::Tensor& batch);

  // Full (TP-gathered, unpadded) tensors of the parameters this rank holds,
  // by global name; a stage's copy of another stage's parameter under its
  // own name. Collective over tp.
  std::map<std::string, at::Tensor> gather_local_parameters() const;

  // This rank's state by global name (what checkpoints save and reshard):
  //   model.<name>               parameters (their shard, with ShardSpec)
  //   optim.<name>.<state>       optimizer state of a parameter (exp_avg,
  //                              exp_avg_sq, momentum_buffer, master, step)
  //   optim.step_count           optimizer steps taken
  //   scaler.<key>               the loss scaler (f16)
  //   rng.stage<k>.<stream>      dropout streams of each stage this rank holds
  //   engine.step                train_step calls so far
  // Under ZeRO the optimizer state of a parameter (and at stage 3 the
  // parameter itself) is this rank's segment of it, described by
  // StateTensor::flat_offset/flat_shape; parameters with no element in this
  // rank's shards have no optim.* keys here.
  // Tensors alias the live state: clone to keep a snapshot. Not collective.
  StateDict state_dict() const;
  // Loads a state_dict() of the same layout. Every key, shape and dtype is
  // checked before anything changes (InvalidArgument naming the key); keys
  // of another rank's stages are errors. Not collective.
  void load_state_dict(const StateDict& state);
  // Creates the optimizer state of every parameter now (zeros, step 0)
  // where it does not exist yet, so that state_dict() lists every key a
  // loaded checkpoint fills (a fresh trainer creates it at the first step).
  // Not collective.
  void init_optimizer_state();
  // Called on this rank in every train_step right before the step changes
  // the parameters or the optimizer state (after the backward, the gradient
  // sync and the loss scaler's update): an asynchronous checkpoint holds it
  // there until its snapshot of them is taken (engine/checkpointing.h). Empty
  // removes it. Not collective; the hook must not communicate.
  void set_before_update(std::function<void()> hook);

  int64_t num_parameters() const;
  double flops_per_token(int64_t seq_len) const;

  // The rank that logs: the last pipeline stage, dp 0, tp 0.
  bool is_logging_rank() const;
  const comm::DeviceMesh& mesh() const;
  const ParallelLayout& layout() const { return layout_; }
  const Model& model() const { return *model_; }
  // This step's schedule (sized for num_micro).
  const pp::Schedule& schedule() const;
  // Which part of the model each stage holds ("embedding + blocks 0-1").
  std::vector<std::string> describe_stages() const;
  // ZeRO of each chunk this rank holds (empty without ZeRO): memory and
  // communication figures (benchmarks, tests).
  std::vector<const dp::Zero*> zero_syncs() const;
  // The executor's result of the last step on this rank.
  const pp::StepResult& last_pipeline_result() const;
  int64_t steps_taken() const;

 private:
  struct Impl;
  std::shared_ptr<const Model> model_;
  ParallelLayout layout_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace torus::engine
