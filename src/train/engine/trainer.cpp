#include "torus/train/trainer.h"

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

namespace torus::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

// ---- ParallelLayout -----------------------------------------------------------------

void ParallelLayout::validate(int world_size) const {
  TORUS_CHECK(tp >= 1 && pp >= 1 && dp >= 1 && ep >= 1, InvalidArgument,
              "layout: tp, pp, dp and ep must be >= 1 (got tp={} pp={} dp={} ep={})", tp, pp, dp, ep);
  TORUS_CHECK(tp * pp * dp * ep == world_size, InvalidArgument,
              "layout: tp x pp x dp x ep = {} x {} x {} x {} = {} ranks, but the world has {}", tp, pp, dp, ep,
              tp * pp * dp * ep, world_size);
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
  if (ep > 1) s += " ep=" + std::to_string(ep);
  if (sequence_parallel) s += " sp";
  s += ", " + std::string(pp::schedule_kind_name(schedule));
  if (num_chunks > 1) s += " v=" + std::to_string(num_chunks);
  s += ", m=" + std::to_string(num_micro);
  return s;
}

// ---- the engine ---------------------------------------------------------------------

namespace {

// ZeRO-3 of the dense and of the expert parameters around the same blocks.
class ChainedBlockHooks : public parallel::BlockHooks {
 public:
  ChainedBlockHooks(std::shared_ptr<parallel::BlockHooks> outer, std::shared_ptr<parallel::BlockHooks> inner)
      : outer_(std::move(outer)), inner_(std::move(inner)) {}
  at::Tensor run_block(int64_t layer, const at::Tensor& x, const parallel::BlockFn& run) override {
    return outer_->run_block(layer, x, [&](const at::Tensor& y) { return inner_->run_block(layer, y, run); });
  }

 private:
  std::shared_ptr<parallel::BlockHooks> outer_, inner_;
};

}  // namespace

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
  expert::RoutingSummary routing_stats(bool stepped) {
    const auto [layers, experts] = model->routing_shape();
    if (layers <= 0) return {};
    std::vector<expert::LayerRoutingStats> mine;
    for (auto& c : chunks) {
      for (auto& l : c->end_step(stepped)) mine.push_back(std::move(l));
    }
    std::vector<double> packed = expert::RoutingSummary::pack(mine, layers, experts);
    if (P > 1) {
      at::Tensor t = at::tensor(packed, at::TensorOptions().dtype(at::kDouble));
      pp_group->all_reduce(t)->wait();
      packed.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    }
    return expert::RoutingSummary::unpack(packed, layers, experts);
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
  m.model_layout =
      ModelLayout{layout_.tp, layout_.sequence_parallel, layout_.num_stages(), layout_.layers_per_stage, layout_.ep};
  model_->validate(m.model_layout);
  TORUS_CHECK(optim.lr >= 0 && optim.weight_decay >= 0 && optim.eps > 0 && optim.beta1 >= 0 && optim.beta1 < 1 &&
                  optim.beta2 >= 0 && optim.beta2 < 1 && optim.grad_clip >= 0,
              InvalidArgument,
              "Trainer: bad optimizer settings (lr {}, weight_decay {}, betas ({}, {}), eps {}, grad_clip {})",
              optim.lr, optim.weight_decay, optim.beta1, optim.beta2, optim.eps, optim.grad_clip);
  TORUS_CHECK(options.zero_stage >= 0 && options.zero_stage <= 3, InvalidArgument,
              "Trainer: zero_stage must be 0, 1, 2 or 3, got {}", options.zero_stage);
  TORUS_CHECK(options.offload == dp::Offload::kNone || options.zero_stage >= 1, InvalidArgument,
              "Trainer: offload '{}' needs ZeRO (zero_stage >= 1)", dp::offload_name(options.offload));
  TORUS_CHECK(options.offload != dp::Offload::kOptimizerAndParams || options.zero_stage == 3, InvalidArgument,
              "Trainer: offload '{}' needs zero_stage 3, got {}", dp::offload_name(options.offload),
              options.zero_stage);
  TORUS_CHECK(options.zero_prefetch >= 0, InvalidArgument, "Trainer: zero_prefetch must be >= 0, got {}",
              options.zero_prefetch);
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
      world, std::vector<std::pair<std::string, int>>{
                 {"pp", layout_.pp}, {"dp", layout_.dp}, {"ep", layout_.ep}, {"tp", layout_.tp}});
  m.groups = parallel::ParallelGroups::from_mesh(*m.mesh);
  auto drop_trivial = [](comm::ProcessGroupPtr& g) {
    if (g && g->size() == 1) g = nullptr;
  };
  for (auto* g : {&m.groups.tp, &m.groups.dp, &m.groups.dp_tp, &m.groups.ep, &m.groups.tokens, &m.groups.expert_dp,
                  &m.groups.expert_dp_tp}) {
    drop_trivial(*g);
  }
  m.rank = m.mesh->coord("pp");
  m.pp_group = m.mesh->group("pp");
  m.mp_group = m.mesh->group(std::vector<std::string>{"pp", "ep", "tp"});
  m.eval_group = m.pp_group->split(0, m.rank, "pp.eval");

  // ZeRO-3 builds the stages without drawing their parameters; the units
  // draw them one at a time (Note [Deferred initialisation]), so that no
  // rank holds its whole model replica.
  tp::DeferredInit deferred;
  {
    std::optional<tp::DeferredInit::Scope> scope;
    if (options.zero_stage == 3) scope.emplace(deferred);
    for (int c = 0; c < m.V; ++c) m.chunks.push_back(model_->build_stage(m.stage_of(c), m.model_layout, m.groups));
  }

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
    const int dp_tp_index = m.groups.dp_rank() * layout_.tp + m.mesh->coord("tp");
    m.emb_group = world->split(m.tied_params.empty() ? -1 : dp_tp_index, m.rank, "tied");
    if (m.emb_group && m.emb_group->size() < 2) m.emb_group = nullptr;  // both copies on this rank
  }

  // Note [Mixed precision in the engine].
  const c10::ScalarType dtype = model_->param_dtype();
  m.half = dtype == at::kHalf || dtype == at::kBFloat16;
  const bool main_grads = m.half && !options.grads_in_param_dtype;
  if (dtype == at::kHalf) m.scaler.emplace(options.loss_scaler);
  const int zero_stage = options.zero_stage;
  // Per chunk, the dense parameters and the experts' (Note [MoE groups]):
  // each kind gets its own gradient sync over its own groups.
  const parallel::ParallelGroups expert_groups = m.groups.for_experts();
  for (int c = 0; c < m.V; ++c) {
    std::vector<StageParameter> all = m.chunks[c]->parameters();
    std::shared_ptr<parallel::BlockHooks> chunk_hooks;
    const bool hooks = zero_stage == 3 && m.chunks[c]->set_block_hooks(nullptr);
    if (zero_stage == 3 && !hooks) {
      TORUS_LOG_WARN("trainer: the model does not support block hooks; ZeRO-3 keeps its parameters gathered");
    }
    for (const bool experts : {false, true}) {
      const parallel::ParallelGroups& g = experts ? expert_groups : m.groups;
      std::vector<StageParameter> params;
      for (const auto& p : all) {
        if (p.expert == experts) params.push_back(p);
      }
      if (params.empty()) continue;
      Impl::Sync sync;
      sync.chunk = c;
      // ZeRO takes every parameter but the copies of a parameter tied across
      // stages (their gradients are added with the other stage's, so they
      // stay whole, in a DDP).
      std::vector<StageParameter> ddp_params;
      if (zero_stage >= 1) {
        std::vector<dp::ZeroParameter> zp;
        for (const auto& p : params) {
          if (!p.tie_key.empty()) {
            ddp_params.push_back(p);
            continue;
          }
          zp.push_back({p.name, p.tensor, p.spec, hooks ? p.block : -1, p.weight_decay});
        }
        dp::ZeroOptions zo;
        zo.stage = zero_stage;
        if (main_grads) zo.grad_dtype = at::kFloat;
        zo.offload = options.offload;
        zo.prefetch = options.zero_prefetch;
        zo.materialize = [&deferred](const at::Tensor& p, at::Tensor& out) {
          if (!deferred.deferred(p)) return false;
          deferred.materialize(p, out);
          return true;
        };
        for (auto& p : ddp_params) {
          if (deferred.deferred(p.tensor)) deferred.materialize(p.tensor);  // kept whole: drawn whole
        }
        if (!zp.empty()) {
          sync.zero = std::make_shared<dp::Zero>(std::move(zp), g, zo);
          chunk_hooks = chunk_hooks ? std::make_shared<ChainedBlockHooks>(chunk_hooks, sync.zero)
                                    : std::shared_ptr<parallel::BlockHooks>(sync.zero);
          for (const auto& s : sync.zero->segments()) m.segment_grads[s.value.unsafeGetTensorImpl()] = s.grad;
        }
      } else {
        ddp_params = params;
      }
      bool partial = false;
      for (const auto& p : ddp_params) partial |= p.spec.tp_partial_grad;
      if (!ddp_params.empty() && (g.dp_size() > 1 || (g.tp_size() > 1 && partial) || main_grads)) {
        dp::DDPOptions o;
        o.bucket_cap_bytes = options.bucket_cap_bytes;
        o.overlap = options.overlap_grad_sync;
        o.finish_in_backward = false;
        o.broadcast_parameters = false;  // layout-independent init: dp replicas start equal
        // Shared host buckets serve the ofi backend's zero-copy path only.
        o.shared_host_buckets = m.world->host_backend()->name() == "ofi";
        if (main_grads) o.grad_dtype = at::kFloat;
        std::vector<dp::NamedParameter> named;
        for (const auto& p : ddp_params) named.push_back({p.name, p.tensor, p.spec});
        sync.ddp = std::make_unique<dp::DistributedDataParallel>(std::move(named), g, o);
        for (const auto& p : ddp_params) m.sync_of[p.tensor.unsafeGetTensorImpl()] = sync.ddp.get();
      }
      if (sync.ddp || sync.zero) m.syncs.push_back(std::move(sync));
    }
    if (hooks && chunk_hooks) m.chunks[c]->set_block_hooks(chunk_hooks);
  }

  // Optimizer groups: the model says which parameters decay. Clipping counts
  // shards everywhere, TP-replicated parameters on TP rank 0, copies of a
  // tied parameter nowhere (the owner counts it).
  // Under ZeRO the optimizer sees this rank's segments (zero.h), whose
  // elements are spread over dp: the norm is then reduced over the world,
  // and whole parameters (tied copies) are counted on dp rank 0 only.
  optim::ParamGroup decay, no_decay;
  decay.weight_decay = optim.weight_decay;
  no_decay.weight_decay = 0.0;
  // Expert parameters differ over ep (each rank its experts): they count on
  // every ep rank, dense ones on ep rank 0 (the norm is reduced over
  // pp x ep x tp, or the world under ZeRO).
  m.norm_group = zero_stage >= 1 ? m.world : m.mp_group;
  for (int c = 0; c < m.V; ++c) {
    for (const auto& sync : m.syncs) {
      if (sync.chunk != c || !sync.zero) continue;
      for (const auto& s : sync.zero->segments()) {
        optim::ParamGroup& g = s.weight_decay ? decay : no_decay;
        g.params.push_back(s.value);
        g.names.push_back(s.name);
        m.norm_entries.push_back({s.value, s.counted});
        m.all_params.push_back(s.value);
      }
    }
    for (const auto& p : m.chunks[c]->parameters()) {
      if (m.held_by_zero(p.tensor)) continue;
      optim::ParamGroup& g = p.weight_decay ? decay : no_decay;
      g.params.push_back(p.tensor);
      g.names.push_back(p.name);
      const bool counted = !p.tie_copy && (p.spec.sharded() || m.groups.tp_rank() == 0) &&
                           (p.expert || m.groups.ep_rank() == 0) && (zero_stage == 0 || m.groups.dp_rank() == 0);
      m.norm_entries.push_back({p.tensor, counted});
      m.all_params.push_back(p.tensor);
    }
  }
  optim::OptimizerSpec spec;
  spec.name = optim.name;
  // Offloaded optimizer state is updated on the host by the vectorised CPU
  // Adam (optim/cpu_adam.h).
  if (options.offload != dp::Offload::kNone && (optim.name == "adam" || optim.name == "adamw")) {
    spec.name = "cpu_" + optim.name;
  }
  spec.lr = optim.lr;
  spec.beta1 = optim.beta1;
  spec.beta2 = optim.beta2;
  spec.eps = optim.eps;
  spec.momentum = optim.momentum;
  spec.nesterov = optim.nesterov;
  spec.weight_decay = optim.weight_decay;
  m.optimizer = optim::make_optimizer(spec, {std::move(decay), std::move(no_decay)});
  m.optimizer->set_grad_provider([&m](const at::Tensor& p) { return m.grad_of(p); });

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

std::vector<int64_t> Trainer::local_rows(int64_t global_batch) const {
  return impl_->local_rows(global_batch, "local_rows");
}

StepStats Trainer::train_step(const at::Tensor& batch, double lr) {
  const auto t0 = Clock::now();
  impl_->load_batch(batch, "train_step");
  return impl_->run_step(t0, lr);
}

StepStats Trainer::train_step(const LocalBatch& batch, double lr) {
  const auto t0 = Clock::now();
  impl_->load_rows(batch.rows, batch.global_batch, "train_step");
  return impl_->run_step(t0, lr);
}

StepStats Trainer::Impl::run_step(Clock::time_point t0, double lr) {
  Impl& m = *this;
  TORUS_CHECK(!(lr < 0) || m.optim.lr >= 0, InvalidArgument, "Trainer::train_step: no learning rate");
  const double step_lr = lr >= 0 ? lr : m.optim.lr;
  for (auto& c : m.chunks) c->module()->train();

  // 1-2. The pipeline, with DP sync off until each chunk's last backward.
  for (auto& s : m.syncs) {
    if (s.ddp) s.ddp->set_sync_enabled(false);
    if (s.zero) s.zero->set_sync_enabled(false);
  }
  {
    const double loss_grad = (m.scaler ? m.scaler->scale() : 1.0) / static_cast<double>(m.layout.num_micro);
    for (auto& c : m.chunks) c->set_loss_grad_scale(loss_grad);
  }
  std::fill(m.weight_passes.begin(), m.weight_passes.end(), 0);
  std::fill(m.input_passes.begin(), m.input_passes.end(), 0);
  m.saved.clear();
  m.stores.clear();
  m.evaluating = false;
  m.last_result = m.executor->run(m.schedule, m);
  const auto t_pipe = Clock::now();

  // 3. Finish the DP reductions (started from the last backward's hooks).
  for (auto& s : m.syncs) {
    if (!s.zero) continue;
    s.zero->set_sync_enabled(true);
    s.zero->start();
  }
  for (auto& s : m.syncs) {
    if (!s.ddp) continue;
    s.ddp->set_sync_enabled(true);
    s.ddp->start();
    s.ddp->finish();
  }
  for (auto& s : m.syncs) {
    if (s.zero) s.zero->finish();
  }
  // 4. Tied parameters: the owner and its copy add their gradients.
  if (m.emb_group) {
    for (const at::Tensor& p : m.tied_params) {
      at::Tensor g = m.grad_of(p);
      TORUS_CHECK(g.defined() && g.is_contiguous(), Error, "trainer: a tied parameter has no contiguous gradient");
      m.emb_group->all_reduce(g)->wait();
    }
  }
  StepStats st;
  // Testing: an fp16 overflow on one rank (TrainerOptions::inject_overflow_*).
  if (m.world->rank() == m.options.inject_overflow_rank && m.steps + 1 == m.options.inject_overflow_step) {
    for (const auto& p : m.all_params) {
      at::Tensor g = m.grad_of(p);
      if (g.defined() && g.numel() > 0) {
        g.view(-1)[0].fill_(std::numeric_limits<double>::infinity());
        break;
      }
    }
  }
  // 5. Loss scaling: unscale, and agree over every rank whether any gradient
  // overflowed (Note [Mixed precision in the engine]). The CPU Adam (offload)
  // folds both into passes it makes anyway: the norm of the scaled gradients
  // (reduced over the world under ZeRO) is non-finite exactly when some
  // gradient overflowed, and the kernel multiplies each gradient by
  // 1/scale x the clipping coefficient as it reads it.
  auto* cpu_adam = dynamic_cast<optim::detail::CpuAdamBase*>(m.optimizer.get());
  const bool fold = cpu_adam != nullptr && m.norm_group == m.world;
  if (m.scaler) {
    st.loss_scale = m.scaler->scale();
    if (!fold) {
      const std::vector<at::Tensor> grads = m.current_grads();
      amp::unscale_(grads, m.scaler->inv_scale());
      st.overflow = amp::found_non_finite(grads, m.world);
      m.scaler->update(st.overflow);
    }
  }
  // 6. Global norm, clipping, one optimizer step.
  for (auto& e : m.norm_entries) e.grad = m.grad_of(e.param);
  optim::ClipResult clip;
  if (fold) {
    clip = optim::clip_grad_norm(m.norm_entries, /*max_norm=*/0.0, m.norm_group);  // the norm only
    const double inv = m.scaler ? m.scaler->inv_scale() : 1.0;
    if (m.scaler) {
      st.overflow = !clip.finite;
      m.scaler->update(st.overflow);
    }
    if (clip.finite) {
      clip.norm *= inv;
      const double clip_max = m.optim.grad_clip;
      clip.coefficient = clip_max > 0 && clip.norm > clip_max ? clip_max / (clip.norm + 1e-6) : 1.0;
      cpu_adam->set_grad_scale(inv * clip.coefficient);
    }
  } else if (!st.overflow) {
    clip = optim::clip_grad_norm(m.norm_entries, m.optim.grad_clip, m.norm_group);
  }
  if (m.before_update) m.before_update();
  if (!st.overflow && clip.finite) {
    m.optimizer->step(step_lr);
    for (auto& s : m.syncs) {
      if (s.zero) s.zero->publish_parameters();
    }
  } else {
    st.skipped = true;
    ++m.skipped_steps;
    if (st.overflow) {
      TORUS_LOG_INFO("trainer: step {} skipped: fp16 gradients overflowed at loss scale {}; the scale is now {}",
                     m.steps + 1, st.loss_scale, m.scaler->scale());
      clip.norm = std::numeric_limits<double>::infinity();
    } else {
      TORUS_LOG_WARN("trainer: step {} skipped: the gradient norm is {}", m.steps + 1, clip.norm);
    }
  }
  m.zero_grads();
  st.routing = m.routing_stats(!st.skipped);
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
  st.tokens = m.batch_tokens;
  st.peak_live = m.last_result.peak_live;
  st.skipped_steps = m.skipped_steps;
  st.pipeline_seconds = std::chrono::duration<double>(t_pipe - t0).count();
  st.sync_seconds = std::chrono::duration<double>(t_sync - t_pipe).count();
  st.seconds = seconds_since(t0);
  return st;
}

double Trainer::evaluate(const at::Tensor& batch) {
  impl_->load_batch(batch, "evaluate");
  return impl_->run_eval();
}

double Trainer::evaluate(const LocalBatch& batch) {
  impl_->load_rows(batch.rows, batch.global_batch, "evaluate");
  return impl_->run_eval();
}

double Trainer::Impl::run_eval() {
  Impl& m = *this;
  at::NoGradGuard no_grad;
  for (auto& c : m.chunks) c->module()->eval();
  std::optional<amp::AutocastGuard> autocast;
  if (m.options.autocast) autocast.emplace(m.model->device().type(), *m.options.autocast);
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
  for (const auto& s : impl_->syncs) {
    if (s.zero) s.zero->gather_all();  // stage 3: every block materialised for the read
  }
  for (const auto& c : impl_->chunks) {
    for (auto& [name, t] : c->gather_full_parameters(impl_->groups.tp)) out[name] = t.clone();
  }
  for (const auto& s : impl_->syncs) {
    if (s.zero) s.zero->release_all();
  }
  return out;
}

StateDict Trainer::state_dict() const {
  const Impl& m = *impl_;
  auto tied_key = [](const StageParameter& p) { return p.tied_to.empty() ? std::string() : "model." + p.tied_to; };
  StateDict out;
  std::map<std::string, tp::ShardSpec> specs;
  std::map<std::string, const dp::ZeroSegment*> segments;  // ZeRO: this rank's segment of a parameter
  std::map<std::string, std::string> tied;                 // a tie copy's name -> the owner's
  std::set<std::string> experts;                           // expert parameters' names
  for (int c = 0; c < m.V; ++c) {
    for (const auto& p : m.chunks[c]->parameters()) {
      const dp::Zero* zero = m.zero_of(p.tensor);
      specs[p.name] = p.spec;
      if (!p.tied_to.empty()) tied[p.name] = p.tied_to;
      const dp::ZeroSegment* seg = zero ? zero->segment_of(p.tensor) : nullptr;
      if (seg) segments[p.name] = seg;
      if (p.expert) experts.insert(p.name);
      if (zero && zero->param_sharded(p.tensor)) {
        if (seg) {
          out["model." + p.name] = {seg->value, p.spec, false, seg->offset, seg->shard_shape, tied_key(p), p.expert};
        }
        continue;
      }
      out["model." + p.name] = {p.tensor, p.spec, false, -1, {}, tied_key(p), p.expert};
    }
    for (const auto& [stream, t] : m.chunks[c]->rng_state()) {
      out[fmt::format("rng.stage{}.{}", m.stage_of(c), stream)] = {t, {}, stream == "sharded"};
    }
    for (const auto& [name, t] : m.chunks[c]->extra_state()) out["model." + name] = {t, {}, false};
  }
  for (const auto& [key, t] : m.optimizer->state_dict()) {
    // "<param name>.<state>": the state of a parameter is laid out like it
    // when it has its shape (exp_avg, master...), replicated otherwise.
    StateTensor st{t, {}, false};
    const size_t dot = key.rfind('.');
    if (dot != std::string::npos) {
      auto it = specs.find(key.substr(0, dot));
      if (it != specs.end() && t.dim() > 0) st.spec = it->second;
      st.expert = experts.count(key.substr(0, dot)) > 0;
      auto tie = tied.find(key.substr(0, dot));
      if (tie != tied.end()) st.tied_to = "optim." + tie->second + key.substr(dot);
      auto seg = segments.find(key.substr(0, dot));
      if (seg != segments.end() && t.dim() > 0) {
        st.flat_offset = seg->second->offset;
        st.flat_shape = seg->second->shard_shape;
      }
    }
    out["optim." + key] = st;
  }
  if (m.scaler) {
    for (const auto& [key, t] : m.scaler->state_dict()) out["scaler." + key] = {t, {}, false};
  }
  out["engine.step"] = {at::full({}, m.steps, at::TensorOptions().dtype(at::kLong)), {}, false};
  out["engine.skipped_steps"] = {at::full({}, m.skipped_steps, at::TensorOptions().dtype(at::kLong)), {}, false};
  return out;
}

void Trainer::load_state_dict(const StateDict& state) {
  Impl& m = *impl_;
  const StateDict mine = state_dict();
  // Check everything first: the same keys, shapes and dtypes.
  for (const auto& [key, t] : mine) {
    auto it = state.find(key);
    TORUS_CHECK(it != state.end(), InvalidArgument, "Trainer::load_state_dict: '{}' is missing", key);
    TORUS_CHECK(it->second.tensor.defined() && it->second.tensor.sizes() == t.tensor.sizes() &&
                    it->second.tensor.scalar_type() == t.tensor.scalar_type(),
                InvalidArgument, "Trainer::load_state_dict: '{}' has shape {} {}, this rank holds {} {}", key,
                it->second.tensor.defined() ? c10::str(it->second.tensor.sizes()) : "undefined",
                it->second.tensor.defined() ? c10::toString(it->second.tensor.scalar_type()) : "",
                c10::str(t.tensor.sizes()), c10::toString(t.tensor.scalar_type()));
  }
  for (const auto& [key, t] : state) {
    TORUS_CHECK(mine.count(key) || key.rfind("optim.", 0) == 0, InvalidArgument,
                "Trainer::load_state_dict: '{}' is not state of this rank", key);
  }
  std::map<std::string, at::Tensor> optim_state;
  for (const auto& [key, t] : state) {
    if (key.rfind("optim.", 0) == 0) optim_state[key.substr(6)] = t.tensor;
  }
  m.optimizer->load_state_dict(optim_state);  // checks its own keys before changing anything
  at::NoGradGuard no_grad;
  for (const auto& [key, t] : mine) {
    if (key.rfind("model.", 0) != 0) continue;
    at::Tensor dst = t.tensor;  // the live parameter, or its ZeRO segment
    dst.copy_(state.at(key).tensor);
  }
  for (const auto& s : m.syncs) {
    if (s.zero) s.zero->after_load();
  }
  for (int c = 0; c < m.V; ++c) {
    std::map<std::string, at::Tensor> rng;
    for (const auto& [stream, t] : m.chunks[c]->rng_state()) {
      rng[stream] = state.at(fmt::format("rng.stage{}.{}", m.stage_of(c), stream)).tensor;
    }
    m.chunks[c]->set_rng_state(rng);
  }
  if (m.scaler) {
    std::map<std::string, at::Tensor> sc;
    for (const auto& [key, t] : state) {
      if (key.rfind("scaler.", 0) == 0) sc[key.substr(7)] = t.tensor;
    }
    m.scaler->load_state_dict(sc);
  }
  m.steps = state.at("engine.step").tensor.item<int64_t>();
  m.skipped_steps = state.at("engine.skipped_steps").tensor.item<int64_t>();
}

void Trainer::init_optimizer_state() {
  impl_->optimizer->init_state();
}
void Trainer::set_before_update(std::function<void()> hook) {
  impl_->before_update = std::move(hook);
}

int64_t Trainer::num_parameters() const {
  return model_->num_parameters();
}
double Trainer::flops_per_token(int64_t seq_len) const {
  return model_->flops_per_token(seq_len);
}

bool Trainer::is_logging_rank() const {
  const Impl& m = *impl_;
  return m.rank == m.P - 1 && m.groups.dp_rank() == 0 && m.groups.tp_rank() == 0;
}

const comm::DeviceMesh& Trainer::mesh() const {
  return *impl_->mesh;
}
const pp::Schedule& Trainer::schedule() const {
  return impl_->schedule;
}
const pp::StepResult& Trainer::last_pipeline_result() const {
  return impl_->last_result;
}
std::vector<const dp::Zero*> Trainer::zero_syncs() const {
  std::vector<const dp::Zero*> out;
  for (const auto& s : impl_->syncs) {
    if (s.zero) out.push_back(s.zero.get());
  }
  return out;
}
int64_t Trainer::steps_taken() const {
  return impl_->steps;
}

std::vector<std::string> Trainer::describe_stages() const {
  return model_->describe_stages(impl_->model_layout);
}

}  // namespace torus::train
