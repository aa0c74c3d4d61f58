// Trainer (torus/engine/trainer.h): the layout's checks, construction of the
// parallel model and its synchronisers, state dicts and accessors. The steps
// are in trainer_step.cpp; the state both share in trainer_impl.h.
#include "torus/engine/trainer.h"

#include "engine/trainer_impl.h"


namespace torus::engine {

// ---- ParallelLayout -----------------------------------------------------------------

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


Trainer::Trainer(comm::ProcessGroupPtr world, std::shared_ptr<const Model> model, ParallelLayout layout,
                 OptimizerConfig optim, TrainerOptions options)
    : model_(std::move(model)), layout_(std::move(layout)), impl_(std::make_unique<Impl>()) {
  TORUS_CHECK(world != nullptr, InvalidArgument, "Trainer: the world group is null");
  TORUS_CHECK(model_ != nullptr, InvalidArgument, "Trainer: the model is null");
  // Everything is validated before the first collective.
  layout_ = layout_.resolved(world->size());
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
  m.build_groups();
  // ZeRO-3 builds the stages without drawing their parameters; the units
  // draw them one at a time (Note [Deferred initialisation]), so that no
  // rank holds its whole model replica.
  tp::DeferredInit deferred;
  m.build_stages(deferred);
  m.build_tied_group();
  m.build_grad_syncs(deferred);
  m.build_optimizer();
  m.build_executors(stages);
}

// ---- the constructor's steps (collective, in this order) -------------------------

void Trainer::Impl::build_groups() {
  Impl& m = *this;
  m.mesh = std::make_unique<comm::DeviceMesh>(world, layout.mesh_dims());
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

}

void Trainer::Impl::build_stages(tp::DeferredInit& deferred) {
  Impl& m = *this;
  {
    std::optional<tp::DeferredInit::Scope> scope;
    if (layout.zero == 3) scope.emplace(deferred);
    for (int c = 0; c < m.V; ++c) m.chunks.push_back(model->build_stage(m.stage_of(c), m.model_layout, m.groups));
  }

}

void Trainer::Impl::build_tied_group() {
  Impl& m = *this;
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
    const int dp_tp_index = m.groups.dp_rank() * layout.tp + m.mesh->coord("tp");
    m.emb_group = world->split(m.tied_params.empty() ? -1 : dp_tp_index, m.rank, "tied");
    if (m.emb_group && m.emb_group->size() < 2) m.emb_group = nullptr;  // both copies on this rank
  }

}

void Trainer::Impl::build_grad_syncs(tp::DeferredInit& deferred) {
  Impl& m = *this;
  // Note [Mixed precision in the engine].
  const c10::ScalarType dtype = model->param_dtype();
  m.half = dtype == at::kHalf || dtype == at::kBFloat16;
  const bool main_grads = m.half && !options.grads_in_param_dtype;
  if (dtype == at::kHalf) m.scaler.emplace(options.loss_scaler);
  const int zero_stage = layout.zero;
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
          // Stage 2 reduces per block (its units), stage 3 also gathers per block.
          zp.push_back({p.name, p.tensor, p.spec, hooks || zero_stage == 2 ? p.block : -1, p.weight_decay});
        }
        dp::ZeroOptions zo;
        zo.stage = zero_stage;
        if (main_grads) zo.grad_dtype = at::kFloat;
        zo.offload = layout.offload;
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

}

void Trainer::Impl::build_optimizer() {
  Impl& m = *this;
  const int zero_stage = layout.zero;
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
  if (layout.offload != dp::Offload::kNone && (optim.name == "adam" || optim.name == "adamw")) {
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

}

void Trainer::Impl::build_executors(const std::vector<std::string>& stages) {
  Impl& m = *this;
  pp::ExecutorOptions eo;
  eo.device = model->device();
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

}  // namespace torus::engine
