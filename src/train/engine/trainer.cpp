#include "torus/train/trainer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "core/log.h"
#include "torus/optim/adamw.h"
#include "torus/optim/clip.h"
#include "torus/parallel/data/ddp.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/pipeline/executor.h"
#include "torus/parallel/tensor/sharding.h"
#include "torus/parallel/tensor/weight_grad.h"

namespace torus::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

// ---- ParallelLayout -----------------------------------------------------------------

void ParallelLayout::validate(int world_size) const {
  TORUS_CHECK(tp >= 1 && pp >= 1 && dp >= 1, InvalidArgument, "layout: tp, pp and dp must be >= 1 (got tp={} pp={} dp={})",
              tp, pp, dp);
  TORUS_CHECK(tp * pp * dp == world_size, InvalidArgument,
              "layout: tp x pp x dp = {} x {} x {} = {} ranks, but the world has {}", tp, pp, dp, tp * pp * dp,
              world_size);
  TORUS_CHECK(num_micro >= 1, InvalidArgument, "layout: num_micro must be >= 1, got {}", num_micro);
  TORUS_CHECK(num_chunks >= 1, InvalidArgument, "layout: num_chunks must be >= 1, got {}", num_chunks);
  if (num_chunks > 1) {
    TORUS_CHECK(schedule == pp::ScheduleKind::kInterleaved1F1B, InvalidArgument,
                "layout: {} chunks per pipeline rank need the interleaved schedule, not '{}'", num_chunks,
                pp::schedule_kind_name(schedule));
    TORUS_CHECK(pp >= 2, InvalidArgument, "layout: the interleaved schedule with {} chunks needs pp >= 2", num_chunks);
    TORUS_CHECK(num_micro % pp == 0, InvalidArgument,
                "layout: the interleaved schedule needs num_micro ({}) to be a multiple of pp ({})", num_micro, pp);
  }
  if (!layers_per_stage.empty()) {
    TORUS_CHECK(static_cast<int>(layers_per_stage.size()) == num_stages(), InvalidArgument,
                "layout: {} layer counts given for {} stages (pp x chunks = {} x {})", layers_per_stage.size(),
                num_stages(), pp, num_chunks);
  }
}

std::string ParallelLayout::describe() const {
  std::string s = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp);
  if (sequence_parallel) s += " sp";
  s += ", " + std::string(pp::schedule_kind_name(schedule));
  if (num_chunks > 1) s += " v=" + std::to_string(num_chunks);
  s += ", m=" + std::to_string(num_micro);
  return s;
}

// ---- the engine ---------------------------------------------------------------------

struct Trainer::Impl : public pp::StageCallbacks {
  std::shared_ptr<const Model> model;
  ModelLayout model_layout;
  ParallelLayout layout;
  OptimizerConfig optim;
  TrainerOptions options;

  comm::ProcessGroupPtr world;
  std::unique_ptr<comm::DeviceMesh> mesh;
  parallel::ParallelGroups groups;
  comm::ProcessGroupPtr pp_group;    // the executor's (it owns the point-to-point tags)
  comm::ProcessGroupPtr eval_group;  // forward-only passes (their own tags)
  comm::ProcessGroupPtr mp_group;    // pp x tp: the global gradient norm
  comm::ProcessGroupPtr emb_group;   // first and last pipeline rank (tied embeddings), else null
  int P = 1, V = 1, S = 1, rank = 0;

  std::vector<std::unique_ptr<StageModule>> chunks;
  std::vector<std::unique_ptr<dp::GradSync>> syncs;  // per chunk, null if nothing to reduce
  std::unique_ptr<optim::AdamW> optimizer;
  std::vector<optim::GradNormEntry> norm_entries;
  std::vector<at::Tensor> tied_params;  // parameters shared with another stage (owner or copy), in name order

  pp::Schedule schedule;
  std::unique_ptr<pp::PipelineExecutor> executor;
  pp::Schedule eval_schedule;  // forward only, sized for num_micro
  std::unique_ptr<pp::PipelineExecutor> eval_executor;
  bool evaluating = false;
  pp::StepResult last_result;
  int64_t steps = 0;

  // Per step.
  std::vector<at::Tensor> inputs, labels;
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
      return stage == S - 1 ? module->loss(out, labels.at(micro)).detach() : out.contiguous();
    }
    Saved sv;
    at::Tensor out;
    tp::DeferWeightGradGuard defer(split_backward);
    if (stage == 0) {
      out = module->forward(inputs.at(micro));
    } else {
      sv.input = input.detach().requires_grad_(true);
      out = module->forward(sv.input);
    }
    if (stage == S - 1) {
      at::Tensor loss = module->loss(out, labels.at(micro));
      sv.root = loss / static_cast<double>(layout.num_micro);
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
    auto& sync = syncs.at(chunk);
    if (sync && options.overlap_grad_sync) sync->set_sync_enabled(done == layout.num_micro);
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

  // Splits the global batch: this dp rank's rows, then num_micro micro-batches.
  void load_batch(const at::Tensor& batch, const char* what) {
    TORUS_CHECK(batch.defined() && batch.dim() == 2 && batch.scalar_type() == at::kLong, InvalidArgument,
                "Trainer::{}: batch must be a [global_batch, seq + 1] int64 tensor", what);
    const int64_t rows = batch.size(0), seq = batch.size(1) - 1;
    const int64_t parts = int64_t{layout.dp} * layout.num_micro;
    TORUS_CHECK(rows >= parts && rows % parts == 0, InvalidArgument,
                "Trainer::{}: a global batch of {} rows does not split into dp x micro-batches = {} x {} equal parts",
                what, rows, layout.dp, layout.num_micro);
    TORUS_CHECK(seq >= 1, InvalidArgument, "Trainer::{}: the batch needs at least 2 columns (seq + 1)", what);
    model->validate_sequence(seq, model_layout);
    at::Tensor local = batch.chunk(layout.dp, 0)[groups.dp_rank()].to(model->device());
    inputs.clear();
    labels.clear();
    for (const at::Tensor& mb : local.chunk(layout.num_micro, 0)) {
      inputs.push_back(mb.narrow(1, 0, seq).contiguous());
      labels.push_back(mb.narrow(1, 1, seq).contiguous());
    }
  }

  void zero_grads() {
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (syncs[c]) {
        syncs[c]->clear_grads();  // backward copies each gradient in: one pass
      } else {
        for (auto& p : chunks[c]->module()->parameters()) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
      }
    }
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

Trainer::Trainer(comm::ProcessGroupPtr world, std::shared_ptr<const Model> model, ParallelLayout layout,
                 OptimizerConfig optim, TrainerOptions options)
    : model_(std::move(model)), layout_(std::move(layout)), impl_(std::make_unique<Impl>()) {
  TORUS_CHECK(world != nullptr, InvalidArgument, "Trainer: the world group is null");
  TORUS_CHECK(model_ != nullptr, InvalidArgument, "Trainer: the model is null");
  // Everything is validated before the first collective.
  layout_.validate(world->size());
  Impl& m = *impl_;
  m.model = model_;
  m.model_layout = ModelLayout{layout_.tp, layout_.sequence_parallel, layout_.num_stages(), layout_.layers_per_stage};
  model_->validate(m.model_layout);
  TORUS_CHECK(optim.lr >= 0 && optim.weight_decay >= 0 && optim.eps > 0 && optim.beta1 >= 0 && optim.beta1 < 1 &&
                  optim.beta2 >= 0 && optim.beta2 < 1 && optim.grad_clip >= 0,
              InvalidArgument,
              "Trainer: bad optimizer settings (lr {}, weight_decay {}, betas ({}, {}), eps {}, grad_clip {})",
              optim.lr, optim.weight_decay, optim.beta1, optim.beta2, optim.eps, optim.grad_clip);
  m.layout = layout_;
  m.optim = optim;
  m.options = options;
  m.world = world;
  m.P = layout_.pp;
  m.V = layout_.num_chunks;
  m.S = layout_.num_stages();
  const std::vector<std::string> stages = model_->describe_stages(m.model_layout);
  m.schedule = pp::make_schedule({layout_.schedule, m.P, layout_.num_micro, m.V});
  pp::check_schedule(m.schedule);
  m.eval_schedule = pp::forward_only(m.P, layout_.num_micro, m.V);
  pp::check_schedule(m.eval_schedule);

  // Collective from here on.
  m.mesh = std::make_unique<comm::DeviceMesh>(
      world, std::vector<std::pair<std::string, int>>{{"pp", layout_.pp}, {"dp", layout_.dp}, {"tp", layout_.tp}});
  m.groups = parallel::ParallelGroups::from_mesh(*m.mesh);
  if (m.groups.tp_size() == 1) m.groups.tp = nullptr;
  if (m.groups.dp_size() == 1) m.groups.dp = nullptr;
  if (layout_.tp * layout_.dp == 1) m.groups.dp_tp = nullptr;
  m.rank = m.mesh->coord("pp");
  m.pp_group = m.mesh->group("pp");
  m.mp_group = m.mesh->group(std::vector<std::string>{"pp", "tp"});
  m.eval_group = m.pp_group->split(0, m.rank, "pp.eval");

  for (int c = 0; c < m.V; ++c) m.chunks.push_back(model_->build_stage(m.stage_of(c), m.model_layout, m.groups));

  // Parameters held by two stages (tie_key): the ranks of the copies in
  // each dp x tp coordinate form a group (split is collective over the world).
  std::string tie_key;
  for (const auto& chunk : m.chunks) {
    for (const auto& p : chunk->parameters()) {
      if (p.tie_key.empty()) continue;
      TORUS_CHECK(tie_key.empty() || tie_key == p.tie_key, Unsupported,
                  "Trainer: the model ties two different parameters across stages ('{}' and '{}'); one is supported",
                  tie_key, p.tie_key);
      tie_key = p.tie_key;
      m.tied_params.push_back(p.tensor);
    }
  }
  {
    const int dp_tp_index = m.mesh->coord("dp") * layout_.tp + m.mesh->coord("tp");
    m.emb_group = world->split(m.tied_params.empty() ? -1 : dp_tp_index, m.rank, "tied");
    if (m.emb_group && m.emb_group->size() < 2) m.emb_group = nullptr;  // both copies on this rank
  }

  for (int c = 0; c < m.V; ++c) {
    std::unique_ptr<dp::GradSync> sync;
    if (m.groups.dp_size() > 1 || (m.groups.tp_size() > 1 && layout_.sequence_parallel)) {
      dp::DDPOptions o;
      o.bucket_cap_bytes = options.bucket_cap_bytes;
      o.overlap = options.overlap_grad_sync;
      o.finish_in_backward = false;
      o.broadcast_parameters = false;  // layout-independent init: dp replicas start equal
      std::vector<dp::NamedParameter> named;
      for (const auto& p : m.chunks[c]->parameters()) named.push_back({p.name, p.tensor, p.spec});
      sync = std::make_unique<dp::DistributedDataParallel>(std::move(named), m.groups, o);
    }
    m.syncs.push_back(std::move(sync));
  }

  // Optimizer groups: the model says which parameters decay. Clipping counts
  // shards everywhere, TP-replicated parameters on TP rank 0, copies of a
  // tied parameter nowhere (the owner counts it).
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& chunk : m.chunks) {
    for (const auto& p : chunk->parameters()) {
      (p.weight_decay ? decay : no_decay).push_back(p.tensor);
      const bool counted = !p.tie_copy && (p.spec.sharded() || m.groups.tp_rank() == 0);
      m.norm_entries.push_back({p.tensor, counted});
    }
  }
  m.optimizer = std::make_unique<optim::AdamW>(
      std::vector<optim::ParamGroup>{{decay, optim.weight_decay}, {no_decay, 0.0}},
      optim::AdamWOptions{.lr = optim.lr, .beta1 = optim.beta1, .beta2 = optim.beta2, .eps = optim.eps});

  pp::ExecutorOptions eo;
  eo.device = model_->device();
  eo.recv_prefetch = options.recv_prefetch;
  eo.record_trace = options.record_trace;
  // Edge shapes are agreed on the first step (Note [Shape agreement]).
  m.executor = std::make_unique<pp::PipelineExecutor>(m.pp_group, eo);
  eo.record_trace = false;
  m.eval_executor = std::make_unique<pp::PipelineExecutor>(m.eval_group, eo);
  m.weight_passes.assign(m.V, 0);
  m.input_passes.assign(m.V, 0);
  for (const auto& actions : m.schedule.actions) {
    for (const auto& a : actions) m.split_backward |= a.kind == pp::ActionKind::kBackwardInput;
  }
  for (int c = 0; c < m.V; ++c) {
    TORUS_LOG_DEBUG("trainer: pipeline rank {} chunk {} = stage {}: {}", m.rank, c, m.stage_of(c),
                    stages[m.stage_of(c)]);
  }
}

Trainer::~Trainer() = default;

StepStats Trainer::train_step(const at::Tensor& batch, double lr) {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  m.load_batch(batch, "train_step");
  TORUS_CHECK(!(lr < 0) || m.optim.lr >= 0, InvalidArgument, "Trainer::train_step: no learning rate");
  const double step_lr = lr >= 0 ? lr : m.optim.lr;
  for (auto& c : m.chunks) c->module()->train();

  // 1-2. The pipeline, with DP sync off until each chunk's last backward.
  for (auto& sync : m.syncs) {
    if (sync) sync->set_sync_enabled(false);
  }
  std::fill(m.weight_passes.begin(), m.weight_passes.end(), 0);
  std::fill(m.input_passes.begin(), m.input_passes.end(), 0);
  m.saved.clear();
  m.stores.clear();
  m.evaluating = false;
  m.last_result = m.executor->run(m.schedule, m);
  const auto t_pipe = Clock::now();

  // 3. Finish the DP reductions (started from the last backward's hooks).
  for (auto& sync : m.syncs) {
    if (!sync) continue;
    sync->set_sync_enabled(true);
    sync->start();
    sync->finish();
  }
  // 4. Tied parameters: the owner and its copy add their gradients.
  if (m.emb_group) {
    for (const at::Tensor& p : m.tied_params) {
      at::Tensor g = p.grad();
      TORUS_CHECK(g.defined() && g.is_contiguous(), Error, "trainer: a tied parameter has no contiguous gradient");
      m.emb_group->all_reduce(g)->wait();
    }
  }
  // 5. Global norm, clipping, one optimizer step.
  const optim::ClipResult clip = optim::clip_grad_norm(m.norm_entries, m.optim.grad_clip, m.mp_group);
  StepStats st;
  if (clip.finite) {
    m.optimizer->step(step_lr);
  } else {
    st.skipped = true;
    TORUS_LOG_WARN("trainer: step {} skipped: the gradient norm is {}", m.steps + 1, clip.norm);
  }
  m.zero_grads();
  const auto t_sync = Clock::now();

  double local = 0;
  if (m.rank == m.P - 1) {
    for (const at::Tensor& l : m.last_result.losses) local += l.item<double>();
    local /= static_cast<double>(m.layout.num_micro);
  }
  st.loss = m.share_loss(local, m.pp_group);
  st.step = ++m.steps;
  st.grad_norm = clip.norm;
  st.clip_coefficient = clip.coefficient;
  st.tokens = batch.size(0) * (batch.size(1) - 1);
  st.peak_live = m.last_result.peak_live;
  st.pipeline_seconds = std::chrono::duration<double>(t_pipe - t0).count();
  st.sync_seconds = std::chrono::duration<double>(t_sync - t_pipe).count();
  st.seconds = seconds_since(t0);
  return st;
}

double Trainer::evaluate(const at::Tensor& batch) {
  Impl& m = *impl_;
  m.load_batch(batch, "evaluate");
  at::NoGradGuard no_grad;
  for (auto& c : m.chunks) c->module()->eval();
  m.evaluating = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{m.evaluating};
  const pp::StepResult r = m.eval_executor->run(m.eval_schedule, m);
  double local = 0;
  if (m.rank == m.P - 1) {
    for (const at::Tensor& l : r.losses) local += l.item<double>();
    local /= static_cast<double>(m.layout.num_micro);
  }
  return m.share_loss(local, m.eval_group);
}

std::map<std::string, at::Tensor> Trainer::gather_local_parameters() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& c : impl_->chunks) {
    for (auto& [name, t] : c->gather_full_parameters(impl_->groups.tp)) out[name] = t;
  }
  return out;
}

int64_t Trainer::num_parameters() const { return model_->num_parameters(); }
double Trainer::flops_per_token(int64_t seq_len) const { return model_->flops_per_token(seq_len); }

bool Trainer::is_logging_rank() const {
  const Impl& m = *impl_;
  return m.rank == m.P - 1 && m.groups.dp_rank() == 0 && m.groups.tp_rank() == 0;
}

const comm::DeviceMesh& Trainer::mesh() const { return *impl_->mesh; }
const pp::Schedule& Trainer::schedule() const { return impl_->schedule; }
const pp::StepResult& Trainer::last_pipeline_result() const { return impl_->last_result; }
int64_t Trainer::steps_taken() const { return impl_->steps; }

std::vector<std::string> Trainer::describe_stages() const { return model_->describe_stages(impl_->model_layout); }

}  // namespace torus::train
