// Private: the state of a Trainer (Trainer::Impl), shared by the files that
// implement it — trainer.cpp (construction, state, accessors) and
// trainer_step.cpp (the training and evaluation steps).
#pragma once

#include "torus/engine/trainer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "core/log.h"
#include "torus/amp/autocast.h"
#include "torus/amp/grad_scaling.h"
#include "torus/optim/clip.h"
#include "torus/optim/cpu_adam.h"
#include "torus/optim/optimizer.h"
#include "torus/parallel/data/ddp.h"
#include "torus/parallel/data/zero.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/pipeline/executor.h"
#include "torus/parallel/tensor/sharding.h"
#include "torus/parallel/tensor/weight_grad.h"

namespace torus::engine {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Trainer::Impl : public pp::StageCallbacks {
  std::shared_ptr<const Model> model;
  ModelLayout model_layout;
  ParallelLayout layout;
  OptimizerConfig optim;
  TrainerOptions options;
  std::function<void()> before_update;  // set_before_update: an asynchronous checkpoint's snapshot

  comm::ProcessGroupPtr world;
  std::unique_ptr<comm::DeviceMesh> mesh;
  parallel::ParallelGroups groups;
  comm::ProcessGroupPtr pp_group;    // the executor's (it owns the point-to-point tags)
  comm::ProcessGroupPtr eval_group;  // forward-only passes (their own tags)
  comm::ProcessGroupPtr mp_group;    // pp x ep x tp: the global gradient norm
  comm::ProcessGroupPtr emb_group;   // first and last pipeline rank (tied embeddings), else null
  int P = 1, V = 1, S = 1, rank = 0;

  std::vector<std::unique_ptr<StageModule>> chunks;
  // Per chunk and per kind of parameter (dense; experts, Note [MoE groups]):
  // DDP (null if nothing to reduce) and ZeRO (zero_stage >= 1, else null).
  struct Sync {
    int chunk = 0;
    std::unique_ptr<dp::GradSync> ddp;
    std::shared_ptr<dp::Zero> zero;
  };
  std::vector<Sync> syncs;
  std::unordered_map<const void*, at::Tensor> segment_grads;  // ZeRO segment value -> its reduced gradient
  comm::ProcessGroupPtr norm_group;  // the global norm's reduction: pp x tp, the world under ZeRO
  std::unique_ptr<optim::Optimizer> optimizer;
  std::vector<optim::GradNormEntry> norm_entries;
  std::unordered_map<const void*, dp::GradSync*> sync_of;  // parameter -> the GradSync holding its gradient
  std::vector<at::Tensor> all_params;                      // every parameter of this rank's stages
  std::optional<amp::LossScaler> scaler;                   // f16 parameters
  int64_t skipped_steps = 0;
  bool half = false;                    // bf16/f16 parameters
  std::vector<at::Tensor> tied_params;  // parameters shared with another stage (owner or copy), in name order

  pp::Schedule schedule;
  std::unique_ptr<pp::PipelineExecutor> executor;
  pp::Schedule eval_schedule;  // forward only, sized for num_micro
  std::unique_ptr<pp::PipelineExecutor> eval_executor;
  bool evaluating = false;
  std::map<int, at::Tensor>* captured_logits = nullptr;  // Trainer::logits: the last stage's, by micro-batch
  pp::StepResult last_result;
  int64_t steps = 0;

  // Per step.
  std::vector<at::Tensor> inputs, labels;
  int64_t batch_tokens = 0;  // tokens in the loaded global batch (StepStats::tokens)
  struct Saved {
    at::Tensor input;  // requires grad (stages > 0)
    at::Tensor root;   // output, or the scaled loss on the last stage
  };
  std::map<std::pair<int, int>, Saved> saved;
  std::vector<int> weight_passes;  // per chunk: backward (weight) passes done this step
  std::vector<int> input_passes;   // per chunk: input-gradient passes (split backward)
  bool split_backward = false;     // the schedule splits backward (ZB-H1): defer weight gradients
  std::vector<double> micro_losses;

  int stage_of(int chunk) const { return chunk * P + rank; }
  bool last_stage(int chunk) const { return stage_of(chunk) == S - 1; }

  // ---- StageCallbacks ----

  at::Tensor forward(int micro, int chunk, const at::Tensor& input) override {
    auto& module = chunks.at(chunk);
    const int stage = stage_of(chunk);
    if (evaluating) {
      at::Tensor out = module->forward(stage == 0 ? inputs.at(micro) : input);
      if (stage == S - 1 && captured_logits) (*captured_logits)[micro] = module->full_logits(out, groups.tp).cpu();
      return stage == S - 1 ? module->loss(out, labels.at(micro)).detach() : out.contiguous();
    }
    Saved sv;
    at::Tensor out;
    tp::DeferWeightGradGuard defer(split_backward);
    std::optional<amp::AutocastGuard> autocast;
    if (options.autocast) autocast.emplace(model->device().type(), *options.autocast);
    if (stage == 0) {
      out = module->forward(inputs.at(micro));
    } else {
      sv.input = input.detach().requires_grad_(true);
      out = module->forward(sv.input);
    }
    if (stage == S - 1) {
      at::Tensor loss = module->loss(out, labels.at(micro));
      const double scale = scaler ? scaler->scale() : 1.0;
      sv.root = loss * (scale / static_cast<double>(layout.num_micro));
      saved[{micro, chunk}] = std::move(sv);
      return loss.detach();
    }
    sv.root = out;
    saved[{micro, chunk}] = std::move(sv);
    return out.detach();
  }

  at::Tensor loss(int, const at::Tensor& output) override { return output; }

  static std::vector<at::Tensor> grad_roots(const at::Tensor& grad_output) {
    return grad_output.defined() ? std::vector<at::Tensor>{grad_output} : std::vector<at::Tensor>{};
  }

  // Data-parallel sync overlaps the chunk's last backward: the DDP hooks
  // start bucket all-reduces only during the pass that produces each
  // gradient's final contribution. Fused backward: the m-th one. Split
  // backward: the m-th input-gradient pass (gradients of everything outside
  // tp::linear) and the m-th weight-gradient pass (the deferred linears);
  // weight passes of earlier micro-batches that run in between accumulate
  // silently.
  void set_sync_for_pass(int chunk, std::vector<int>& passes) {
    const int done = ++passes.at(chunk);
    if (!options.overlap_grad_sync) return;
    for (auto& s : syncs) {
      if (s.chunk != chunk) continue;
      if (s.ddp) s.ddp->set_sync_enabled(done == layout.num_micro);
      if (s.zero) s.zero->set_sync_enabled(done == layout.num_micro);
    }
  }

  // Split backward (Note [Deferred weight gradients]): the input-gradient
  // pass runs the whole graph once, with the linear layers' weight gradients
  // recorded in the micro-batch's store instead of computed.
  at::Tensor backward_input(int micro, int chunk, const at::Tensor& grad_output) override {
    set_sync_for_pass(chunk, input_passes);
    tp::WeightGradStoreGuard guard(&stores[{micro, chunk}]);
    return run_backward(micro, chunk, grad_output);
  }

  std::map<std::pair<int, int>, tp::WeightGradStore> stores;  // split backward: BI -> BW

  void backward_weight(int micro, int chunk) override {
    auto it = stores.find({micro, chunk});
    TORUS_CHECK(it != stores.end(), Error,
                "pipeline: weight gradient of micro-batch {} chunk {} before its input gradient", micro, chunk);
    set_sync_for_pass(chunk, weight_passes);
    it->second.flush();
    stores.erase(it);
  }

  at::Tensor backward(int micro, int chunk, const at::Tensor& grad_output) override {
    set_sync_for_pass(chunk, weight_passes);
    return run_backward(micro, chunk, grad_output);
  }

  // Backward through (micro, chunk)'s graph, freeing it; returns the gradient
  // with respect to the chunk's input (undefined on stage 0).
  at::Tensor run_backward(int micro, int chunk, const at::Tensor& grad_output) {
    Saved& sv = saved.at({micro, chunk});
    torch::autograd::backward({sv.root}, grad_roots(grad_output));
    at::Tensor g;
    if (sv.input.defined()) {
      g = sv.input.grad();
      TORUS_CHECK(g.defined(), Error, "pipeline: stage {} produced no input gradient for micro-batch {}",
                  stage_of(chunk), micro);
      g = g.contiguous();
    }
    saved.erase({micro, chunk});
    return g;
  }

  // ---- helpers ----

  // Note [Micro-batch rows]: the global batch is cut into num_micro
  // micro-batches, and each micro-batch into equal row blocks, one per data
  // rank (dp x ep, in the data group's rank order). So the data ranks hold,
  // together, exactly the rows of the single-process micro-batch of the same
  // index — which MoE routing needs (its capacity and auxiliary losses are
  // per micro-batch: Note [Layout-independent routing] in moe.h); for a
  // dense model any split gives the same step.
  // Checks that a global batch of `rows` rows splits over the data ranks and
  // micro-batches; returns the rows per data rank.
  int64_t rows_per_rank(int64_t rows, const char* what) const {
    const int data = layout.data_parallel();
    const int64_t parts = int64_t{data} * layout.num_micro;
    TORUS_CHECK(rows >= parts && rows % parts == 0, InvalidArgument,
                "Trainer::{}: a global batch of {} rows does not split into data ranks (dp x ep) x micro-batches = "
                "{} x {} equal parts",
                what, rows, data, layout.num_micro);
    return rows / data;
  }

  // This data rank's rows of a global batch of `rows` rows, in micro-batch
  // order (Note [Micro-batch rows]).
  std::vector<int64_t> local_rows(int64_t rows, const char* what) const {
    const int64_t mine = rows_per_rank(rows, what);
    const int64_t per_micro = rows / layout.num_micro, b = mine / layout.num_micro;
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(mine));
    for (int64_t mi = 0; mi < layout.num_micro; ++mi) {
      for (int64_t j = 0; j < b; ++j) out.push_back(mi * per_micro + int64_t{groups.dp_rank()} * b + j);
    }
    return out;
  }

  // Loads this rank's rows (local_rows(global_rows), in that order) as the
  // micro-batches' inputs and labels.
  void load_rows(const at::Tensor& rows, int64_t global_rows, const char* what) {
    TORUS_CHECK(rows.defined() && rows.dim() == 2 && rows.scalar_type() == at::kLong, InvalidArgument,
                "Trainer::{}: the batch must be a 2-d int64 tensor of [rows, seq + 1] tokens", what);
    const int64_t mine = rows_per_rank(global_rows, what);
    TORUS_CHECK(rows.size(0) == mine, InvalidArgument,
                "Trainer::{}: this data rank's share of a global batch of {} rows is {} rows (local_rows()), "
                "given {}",
                what, global_rows, mine, rows.size(0));
    const int64_t seq = rows.size(1) - 1;
    TORUS_CHECK(seq >= 1, InvalidArgument, "Trainer::{}: the batch needs at least 2 columns (seq + 1)", what);
    model->validate_sequence(seq, model_layout);
    inputs.clear();
    labels.clear();
    for (const at::Tensor& micro : rows.chunk(layout.num_micro, 0)) {
      at::Tensor mb = micro.to(model->device());
      inputs.push_back(mb.narrow(1, 0, seq).contiguous());
      labels.push_back(mb.narrow(1, 1, seq).contiguous());
    }
    batch_tokens = global_rows * seq;
  }

  // One step / evaluation on the loaded micro-batches (train_step, evaluate).
  // The constructor's steps, collective, in this order (trainer.cpp): the
  // mesh and its groups; this rank's stages (ZeRO-3: their parameters not
  // drawn yet); the group of the copies of a tied parameter; the gradient
  // syncs (DDP, ZeRO) per chunk and kind; the optimizer over what the syncs
  // leave; the pipeline executors.
  void build_groups();
  void build_stages(tp::DeferredInit& deferred);
  void build_tied_group();
  void build_grad_syncs(tp::DeferredInit& deferred);
  void build_optimizer();
  void build_executors(const std::vector<std::string>& stages);

  StepStats run_step(Clock::time_point t0, double lr);
  double run_eval();

  // The global batch: every data rank takes its rows of it.
  void load_batch(const at::Tensor& batch, const char* what) {
    TORUS_CHECK(batch.defined() && batch.dim() == 2 && batch.scalar_type() == at::kLong, InvalidArgument,
                "Trainer::{}: batch must be a [global_batch, seq + 1] int64 tensor", what);
    const std::vector<int64_t> idx = local_rows(batch.size(0), what);
    const at::Tensor index = at::tensor(idx, at::TensorOptions().dtype(at::kLong)).to(batch.device());
    load_rows(batch.index_select(0, index), batch.size(0), what);
  }

  // The gradient the optimizer reads for p (a main-gradient slice or p.grad).
  at::Tensor grad_of(const at::Tensor& p) const {
    auto seg = segment_grads.find(p.unsafeGetTensorImpl());
    if (seg != segment_grads.end()) return seg->second;
    auto it = sync_of.find(p.unsafeGetTensorImpl());
    return it == sync_of.end() ? p.grad() : it->second->grad(p);
  }

  std::vector<at::Tensor> current_grads() const {
    std::vector<at::Tensor> out;
    for (const auto& p : all_params) {
      at::Tensor g = grad_of(p);
      if (g.defined()) out.push_back(g);
    }
    return out;
  }

  void zero_grads() {
    for (auto& s : syncs) {
      if (s.zero) s.zero->clear_grads();
      if (s.ddp) s.ddp->clear_grads();  // backward copies each gradient in: one pass
    }
    for (const auto& chunk : chunks) {
      for (auto& p : chunk->module()->parameters()) {
        if (sync_of.count(p.unsafeGetTensorImpl()) || held_by_zero(p)) continue;
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
    }
  }

  bool held_by_zero(const at::Tensor& p) const {
    for (const auto& s : syncs) {
      if (s.zero && s.zero->holds(p)) return true;
    }
    return false;
  }
  const dp::Zero* zero_of(const at::Tensor& p) const {
    for (const auto& s : syncs) {
      if (s.zero && s.zero->holds(p)) return s.zero.get();
    }
    return nullptr;
  }

  // MoE: the step's routing statistics of every layer, known on every rank
  // (each pipeline rank contributes its stages' layers).
  ep::RoutingSummary routing_stats(bool stepped) {
    const auto [layers, experts] = model->routing_shape();
    if (layers <= 0) return {};
    std::vector<ep::LayerRoutingStats> mine;
    for (auto& c : chunks) {
      for (auto& l : c->end_step(stepped)) mine.push_back(std::move(l));
    }
    std::vector<double> packed = ep::RoutingSummary::pack(mine, layers, experts);
    if (P > 1) {
      at::Tensor t = at::tensor(packed, at::TensorOptions().dtype(at::kDouble));
      pp_group->all_reduce(t)->wait();
      packed.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    }
    return ep::RoutingSummary::unpack(packed, layers, experts);
  }

  // Mean loss over micro-batches on the last stage, averaged over dp, then
  // known on every pipeline rank (broadcast from the last one).
  double share_loss(double local_mean, const comm::ProcessGroupPtr& pipe) {
    at::Tensor t = at::full({1}, local_mean, at::TensorOptions().dtype(at::kDouble));
    if (rank == P - 1 && groups.dp_size() > 1) groups.dp->all_reduce(t, {.op = comm::ReduceOp::kAvg})->wait();
    if (P > 1) pipe->broadcast(t, {.root = P - 1})->wait();
    return t.item<double>();
  }
};

}  // namespace torus::engine
