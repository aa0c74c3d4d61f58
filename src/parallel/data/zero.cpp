// ZeRO stages 1-3 (zero.h): units of flat buffers, reduce-scatter from
// post-accumulation hooks, all-gather after the step (stages 1-2) or around
// every block (stage 3).
#include "torus/parallel/data/zero.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include "core/log.h"
#include "parallel/data/ready_hook.h"

namespace torus::dp {

std::string_view offload_name(Offload offload) {
  switch (offload) {
    case Offload::kNone: return "none";
    case Offload::kOptimizer: return "optimizer";
    case Offload::kOptimizerAndParams: return "optimizer+params";
  }
  return "?";
}

Offload parse_offload(std::string_view text) {
  for (Offload o : {Offload::kNone, Offload::kOptimizer, Offload::kOptimizerAndParams}) {
    if (text == offload_name(o)) return o;
  }
  throw InvalidArgument(fmt::format("offload: '{}' is not one of none, optimizer, optimizer+params", text));
}

std::string ZeroSegment::key() const { return fmt::format("{}[{}:{}]", name, offset, offset + numel); }

namespace {

using Clock = std::chrono::steady_clock;

// Identity in forward; `fn` runs when the gradient reaches the node in
// backward. `fn` is smuggled through the context as an index into a table
// owned by the caller (autograd contexts hold IValues only).
struct BackwardAction {
  std::function<void()> fn;
};

class IdentityWithBackwardAction : public torch::autograd::Function<IdentityWithBackwardAction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t action) {
    ctx->saved_data["action"] = action;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* a = reinterpret_cast<BackwardAction*>(ctx->saved_data["action"].toInt());
    a->fn();
    return {grads.at(0), at::Tensor()};
  }
};

// Storage of a unit's flat parameter buffer: released and re-materialised
// in place, so that every view (autograd's saved ones included) follows.
void release_storage(const at::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, flat.device()));
  s->set_nbytes(0);
}

void materialise_storage(const at::Tensor& flat, size_t nbytes) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  if (s->nbytes() == nbytes && s->data() != nullptr) return;
  TORUS_CHECK(s->allocator() != nullptr, Error, "ZeRO: a parameter buffer has no allocator");
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

}  // namespace

struct Zero::Unit {
  int index = 0;
  int64_t block = -1;
  bool keep_gathered = true;  // stages 1-2, and stage-3 units outside blocks
  comm::ProcessGroupPtr group;  // null: one rank
  int N = 1, r = 0;
  comm::ReduceOp op = comm::ReduceOp::kAvg;
  double post_scale = 1.0;
  c10::ScalarType pdtype = at::kFloat, gdtype = at::kFloat;
  std::vector<int> params;
  std::vector<int64_t> offsets;
  int64_t numel = 0, shard = 0;

  at::Tensor param_flat;   // [numel], pdtype; stage 3 blocks: storage released outside windows
  at::Tensor param_shard;  // [shard]: a view of param_flat (kept gathered) or its own tensor (stage 3)
  at::Tensor host_param;   // offload to the host from a device: the shard the optimizer updates
  at::Tensor grad_full;    // [numel], gdtype: stage 1 persistent, stages 2-3 transient
  at::Tensor grad_shard;   // [shard], gdtype
  at::Tensor host_grad;    // offload from a device: the reduced shard on the host

  // Per step.
  std::vector<char> fired;
  int fired_count = 0;
  bool dirty = false;        // grad_full holds contributions not yet reduced
  bool zero_pending = false; // stage 1: grad_full must be zeroed before the next contribution
  bool wrote_shard = false;  // grad_shard holds this step's reduced gradient
  comm::WorkPtr rs_work;     // in-flight reduce-scatter (in place in grad_full)

  // Stage 3.
  bool gathered = false;
  comm::WorkPtr ag_work;
  int holds = 0;  // forward windows and backward windows open on this unit
  bool prefetched = false;
  BackwardAction before_backward, after_backward;

  int64_t param_bytes() const { return numel * static_cast<int64_t>(c10::elementSize(pdtype)); }
  int64_t grad_bytes() const { return numel * static_cast<int64_t>(c10::elementSize(gdtype)); }
};

Zero::Zero(std::vector<ZeroParameter> params, const parallel::ParallelGroups& groups, ZeroOptions options)
    : groups_(groups), options_(options) {
  TORUS_CHECK(options_.stage >= 1 && options_.stage <= 3, InvalidArgument, "ZeRO: stage must be 1, 2 or 3, got {}",
              options_.stage);
  TORUS_CHECK(options_.offload != Offload::kOptimizerAndParams || options_.stage == 3, InvalidArgument,
              "ZeRO: offload '{}' needs stage 3 (got stage {})", offload_name(options_.offload), options_.stage);
  TORUS_CHECK(options_.max_inflight >= 1, InvalidArgument, "ZeRO: max_inflight must be >= 1, got {}",
              options_.max_inflight);
  TORUS_CHECK(options_.prefetch >= 0, InvalidArgument, "ZeRO: prefetch must be >= 0, got {}", options_.prefetch);
  init(std::move(params));
}

Zero::~Zero() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Zero::init(std::vector<ZeroParameter> params) {
  const int dp = groups_.dp_size();
  const int tp = groups_.tp_size();
  comm::ProcessGroupPtr partial_group = groups_.dp_tp;
  if (!partial_group) partial_group = tp == 1 ? groups_.dp : dp == 1 ? groups_.tp : nullptr;
  params_ = std::move(params);

  // Units: (block, reduce group, dtype, device), in registration order.
  std::map<std::tuple<int64_t, int, int, std::string>, int> keys;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ZeroParameter& p = params_[i];
    TORUS_CHECK(p.tensor.defined() && p.tensor.requires_grad() && p.tensor.is_leaf(), InvalidArgument,
                "ZeRO: parameter '{}' must be a defined leaf that requires grad", p.name);
    TORUS_CHECK(at::isFloatingType(p.tensor.scalar_type()), InvalidArgument,
                "ZeRO: parameter '{}' is {}, not floating point", p.name, c10::toString(p.tensor.scalar_type()));
    const bool partial = p.spec.tp_partial_grad && tp > 1;
    TORUS_CHECK(!partial || dp == 1 || partial_group != nullptr, InvalidArgument,
                "ZeRO: parameter '{}' has gradients partial over TP and needs the dp x tp group (ParallelGroups::dp_tp)",
                p.name);
    // Stages 2-3: a unit per block, so that stage 2 reduce-scatters each
    // block's gradients as backward leaves it (one full-size transient
    // buffer per unit in flight, not the whole model's); stage 1 keeps one
    // full gradient for the step and needs no more units.
    const int64_t block = options_.stage >= 2 ? p.block : -1;
    auto key = std::make_tuple(block, partial ? 1 : 0, static_cast<int>(p.tensor.scalar_type()),
                               p.tensor.device().str());
    auto [it, added] = keys.emplace(key, static_cast<int>(units_.size()));
    if (added) {
      auto u = std::make_unique<Unit>();
      u->index = static_cast<int>(units_.size());
      u->block = block;
      u->keep_gathered = options_.stage < 3 || block < 0;
      u->group = partial ? partial_group : groups_.dp;
      if (parallel::group_size(u->group) <= 1) u->group = nullptr;
      u->N = u->group ? u->group->size() : 1;
      u->r = u->group ? u->group->rank() : 0;
      u->pdtype = p.tensor.scalar_type();
      u->gdtype = options_.grad_dtype && at::isFloatingType(*options_.grad_dtype) ? *options_.grad_dtype : u->pdtype;
      if (partial) {
        u->op = comm::ReduceOp::kSum;  // the TP part is a true sum; the dp part may be averaged
        u->post_scale = options_.average ? 1.0 / dp : 1.0;
      } else {
        u->op = options_.average ? comm::ReduceOp::kAvg : comm::ReduceOp::kSum;
      }
      units_.push_back(std::move(u));
    }
    units_[it->second]->params.push_back(static_cast<int>(i));
  }

  const bool device_offload = options_.offload != Offload::kNone;
  place_.resize(params_.size());
  at::NoGradGuard no_grad;
  for (auto& up : units_) {
    Unit& u = *up;
    int64_t n = 0;
    for (int i : u.params) {
      u.offsets.push_back(n);
      place_[i] = {u.index, n};
      n += params_[i].tensor.numel();
    }
    u.numel = std::max<int64_t>((n + u.N - 1) / u.N * u.N, u.N);
    u.shard = u.numel / u.N;
    const at::Tensor& first = params_[u.params.front()].tensor;
    const at::TensorOptions popts = first.options().dtype(u.pdtype).requires_grad(false);
    u.param_flat = at::zeros({u.numel}, popts);
    for (size_t j = 0; j < u.params.size(); ++j) {
      at::Tensor& t = params_[u.params[j]].tensor;
      at::Tensor view = u.param_flat.narrow(0, u.offsets[j], t.numel());
      at::Tensor out = view.view(t.sizes());
      if (!(options_.materialize && options_.materialize(t, out))) view.copy_(t.reshape({-1}));
      t.set_data(view.view(t.sizes()));  // the parameter is now a view of the flat buffer
    }
    at::Tensor own = u.param_flat.narrow(0, static_cast<int64_t>(u.r) * u.shard, u.shard);
    if (u.keep_gathered) {
      u.param_shard = own;
    } else {
      const bool host_params = options_.offload == Offload::kOptimizerAndParams && !first.device().is_cpu();
      u.param_shard = host_params ? at::empty({u.shard}, popts.device(at::kCPU).pinned_memory(true)) : at::empty_like(own);
      u.param_shard.copy_(own);
      release_storage(u.param_flat);
    }
    u.grad_shard = at::zeros({u.shard}, first.options().dtype(u.gdtype).requires_grad(false));
    if (options_.stage == 1) u.grad_full = at::zeros({u.numel}, first.options().dtype(u.gdtype).requires_grad(false));
    if (device_offload && !u.param_shard.device().is_cpu()) {
      u.host_param = at::empty({u.shard}, popts.device(at::kCPU).pinned_memory(true));
      u.host_param.copy_(u.param_shard);
      u.host_grad = at::empty({u.shard}, u.grad_shard.options().device(at::kCPU).pinned_memory(true));
    }
    u.fired.assign(u.params.size(), 0);
    u.before_backward.fn = [this, up = &u] {
      std::lock_guard<std::mutex> lock(mu_);
      gather_start(*up);
      gather_wait(*up);
      ++up->holds;
      prefetch_after(up->block, -1);
    };
    u.after_backward.fn = [this, up = &u] {
      std::lock_guard<std::mutex> lock(mu_);
      if (up->holds > 0) --up->holds;
      if (up->holds == 0) release(*up);
    };
    memory_.numel += n;
    (u.keep_gathered ? memory_.param_full : memory_.param_shards) +=
        u.keep_gathered ? u.param_bytes() : static_cast<int64_t>(u.param_shard.nbytes());
    memory_.grad_shards += static_cast<int64_t>(u.grad_shard.nbytes());
    if (u.grad_full.defined()) memory_.grad_full += static_cast<int64_t>(u.grad_full.nbytes());
  }

  // Segments: the pieces of parameters inside this rank's shard of each unit.
  const bool tp0 = groups_.tp_rank() == 0;
  for (const auto& up : units_) {
    const Unit& u = *up;
    const int64_t lo = static_cast<int64_t>(u.r) * u.shard, hi = lo + u.shard;
    const at::Tensor& value_base = u.host_param.defined() ? u.host_param : u.param_shard;
    const at::Tensor& grad_base = u.host_grad.defined() ? u.host_grad : u.grad_shard;
    for (size_t j = 0; j < u.params.size(); ++j) {
      const ZeroParameter& p = params_[u.params[j]];
      const int64_t a = std::max(lo, u.offsets[j]), b = std::min(hi, u.offsets[j] + p.tensor.numel());
      if (a >= b) continue;
      ZeroSegment s;
      s.name = p.name;
      s.param = u.params[j];
      s.offset = a - u.offsets[j];
      s.numel = b - a;
      s.value = value_base.narrow(0, a - lo, b - a);
      s.grad = grad_base.narrow(0, a - lo, b - a);
      s.weight_decay = p.weight_decay;
      // Sharded over the unit's group: each element on one rank of it. TP
      // shards differ per TP rank; a dp x tp group covers TP already; a
      // replicated parameter sharded over dp alone repeats on every TP rank.
      s.counted = p.spec.sharded() || (p.spec.tp_partial_grad && tp > 1) || tp0;
      s.shard_shape = p.tensor.sizes().vec();
      s.spec = p.spec;
      segments_.push_back(std::move(s));
    }
  }

  // Forward order of the blocks (stage 3 prefetch).
  for (const auto& up : units_) {
    if (up->block >= 0 && std::find(block_order_.begin(), block_order_.end(), up->block) == block_order_.end()) {
      block_order_.push_back(up->block);
    }
  }
  std::sort(block_order_.begin(), block_order_.end());

  for (size_t i = 0; i < params_.size(); ++i) {
    by_param_[params_[i].tensor.unsafeGetTensorImpl()] = static_cast<int>(i);
    auto acc = torch::autograd::impl::grad_accumulator(params_[i].tensor);
    TORUS_CHECK(acc != nullptr, InvalidArgument, "ZeRO: parameter '{}' is not a leaf", params_[i].name);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<ReadyHook>([this, i] { on_grad_ready(i); })));
    accumulators_.push_back(std::move(acc));
  }
  options_.materialize = nullptr;  // construction only
  TORUS_LOG_DEBUG("ZeRO-{}: {} parameters in {} units, {} segments on this rank", options_.stage, params_.size(),
                  units_.size(), segments_.size());
}

bool Zero::holds(const at::Tensor& param) const { return by_param_.count(param.unsafeGetTensorImpl()) > 0; }

bool Zero::param_sharded(const at::Tensor& param) const {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  return it != by_param_.end() && !units_[place_[it->second].first]->keep_gathered;
}

const ZeroSegment* Zero::segment_of(const at::Tensor& param) const {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  if (it == by_param_.end()) return nullptr;
  for (const auto& s : segments_) {
    if (s.param == it->second) return &s;
  }
  return nullptr;
}

void Zero::after_load() {
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  for (auto& u : units_) {
    if (!u->host_param.defined()) continue;
    if (u->keep_gathered) {
      u->host_param.copy_(u->param_shard);
    } else {
      u->param_shard.copy_(u->host_param);
    }
  }
}

at::Tensor Zero::grad(const at::Tensor&) const { return at::Tensor(); }

comm::ProcessGroupPtr Zero::reduce_group(const at::Tensor& param) const {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  if (it == by_param_.end()) return nullptr;
  return units_[place_[it->second].first]->group;
}

void Zero::set_sync_enabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_enabled_ = enabled;
}

// ---- gradients ------------------------------------------------------------------------

void Zero::ensure_grad_full(Unit& u) {
  if (!u.grad_full.defined()) {
    const at::Tensor& first = params_[u.params.front()].tensor;
    u.grad_full = at::zeros({u.numel}, first.options().dtype(u.gdtype).requires_grad(false));
    transient_bytes_ += u.grad_bytes();
    memory_.transient_peak = std::max(memory_.transient_peak, transient_bytes_);
  } else if (u.zero_pending) {
    u.grad_full.zero_();
  }
  u.zero_pending = false;
}

void Zero::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  at::Tensor& param = params_[index].tensor;
  at::Tensor& g = param.mutable_grad();
  if (!g.defined()) return;
  Unit& u = *units_[place_[index].first];
  if (u.rs_work) complete_locked(u);  // its buffer is about to be written again
  ensure_grad_full(u);
  at::NoGradGuard no_grad;
  u.grad_full.narrow(0, place_[index].second, param.numel()).add_(g.reshape({-1}));
  g = at::Tensor();
  u.dirty = true;
  // Stages 2-3 reduce every pass; stage 1 once, in the pass with sync on.
  const bool counts = options_.stage >= 2 || sync_enabled_;
  const size_t j = std::find(u.params.begin(), u.params.end(), static_cast<int>(index)) - u.params.begin();
  if (counts && !u.fired[j]) {
    u.fired[j] = 1;
    ++u.fired_count;
  }
  if (u.fired_count == static_cast<int>(u.params.size())) flush_locked(u);
}

// Starts the unit's reduce-scatter, in place: rank r's block of grad_full
// receives the reduction of everybody's.
void Zero::flush_locked(Unit& u) {
  std::fill(u.fired.begin(), u.fired.end(), 0);
  u.fired_count = 0;
  if (!u.dirty) return;
  u.dirty = false;
  at::Tensor block = u.grad_full.narrow(0, static_cast<int64_t>(u.r) * u.shard, u.shard);
  if (u.group) {
    u.rs_work = u.group->reduce_scatter(u.grad_full, block, {.op = u.op});
    ++stats_.reduce_scatters;
    stats_.reduce_scatter_bytes += u.grad_bytes();
  } else {
    u.rs_work = nullptr;
  }
  inflight_.push_back(&u);
  if (!u.group) {
    complete_locked(u);
    return;
  }
  drain_locked(static_cast<size_t>(options_.max_inflight));
}

// Waits for the unit's reduce-scatter and adds its block into the shard.
void Zero::complete_locked(Unit& u) {
  auto it = std::find(inflight_.begin(), inflight_.end(), &u);
  if (it == inflight_.end()) return;
  inflight_.erase(it);
  if (u.rs_work) {
    const auto t0 = Clock::now();
    u.rs_work->wait();
    stats_.comm_wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    u.rs_work = nullptr;
  }
  at::NoGradGuard no_grad;
  at::Tensor block = u.grad_full.narrow(0, static_cast<int64_t>(u.r) * u.shard, u.shard);
  if (u.post_scale != 1.0) block.mul_(u.post_scale);
  if (u.wrote_shard) {
    u.grad_shard.add_(block);
  } else {
    u.grad_shard.copy_(block);
    u.wrote_shard = true;
  }
  if (options_.stage == 1) {
    u.zero_pending = true;
  } else {
    u.grad_full = at::Tensor();
    transient_bytes_ -= u.grad_bytes();
  }
}

void Zero::drain_locked(size_t keep) {
  while (inflight_.size() > keep) complete_locked(*inflight_.front());
}

void Zero::start() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& u : units_) {
    if (u->dirty) flush_locked(*u);
  }
}

void Zero::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& u : units_) {
    if (u->dirty) flush_locked(*u);
  }
  drain_locked(0);
  at::NoGradGuard no_grad;
  for (auto& u : units_) {
    if (!u->wrote_shard) {
      u->grad_shard.zero_();  // nothing reached this unit in the step
      u->wrote_shard = true;
    }
    if (u->host_grad.defined()) u->host_grad.copy_(u->grad_shard);
    // Stage 3: a window left open (a block whose input needed no gradient)
    // closes with the step, and so does a prefetch nobody used.
    if (!u->keep_gathered) {
      u->holds = 0;
      release(*u);
    }
  }
}

void Zero::clear_grads() {
  std::lock_guard<std::mutex> lock(mu_);
  drain_locked(0);
  for (auto& u : units_) {
    u->wrote_shard = false;
    u->dirty = false;
    std::fill(u->fired.begin(), u->fired.end(), 0);
    u->fired_count = 0;
    if (options_.stage == 1) u->zero_pending = true;
  }
  for (auto& p : params_) {
    if (p.tensor.grad().defined()) p.tensor.mutable_grad() = at::Tensor();
  }
}

// ---- parameters ------------------------------------------------------------------------

void Zero::publish_parameters() {
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  std::vector<std::pair<Unit*, comm::WorkPtr>> works;
  for (auto& up : units_) {
    Unit& u = *up;
    if (u.host_param.defined()) u.param_shard.copy_(u.host_param);
    if (!u.keep_gathered) continue;  // stage 3 blocks: gathered when they run
    if (!u.group) continue;
    at::Tensor own = u.param_flat.narrow(0, static_cast<int64_t>(u.r) * u.shard, u.shard);
    works.emplace_back(&u, u.group->all_gather(own, u.param_flat));
    ++stats_.all_gathers;
    stats_.all_gather_bytes += u.param_bytes();
  }
  const auto t0 = Clock::now();
  for (auto& [u, w] : works) w->wait();
  stats_.comm_wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

void Zero::gather_start(Unit& u) {
  if (u.keep_gathered || u.gathered || u.ag_work) return;
  at::NoGradGuard no_grad;
  materialise_storage(u.param_flat, static_cast<size_t>(u.param_bytes()));
  gathered_bytes_ += u.param_bytes();
  memory_.gathered_peak = std::max(memory_.gathered_peak, gathered_bytes_);
  at::Tensor own = u.param_flat.narrow(0, static_cast<int64_t>(u.r) * u.shard, u.shard);
  own.copy_(u.param_shard);
  if (u.group) {
    u.ag_work = u.group->all_gather(own, u.param_flat);
    ++stats_.all_gathers;
    stats_.all_gather_bytes += u.param_bytes();
  } else {
    u.gathered = true;
  }
}

void Zero::gather_wait(Unit& u) {
  if (u.keep_gathered) return;
  if (!u.gathered && !u.ag_work) gather_start(u);
  if (u.ag_work) {
    const auto t0 = Clock::now();
    if (u.prefetched) ++stats_.prefetch_hits;
    u.ag_work->wait();
    stats_.comm_wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    u.ag_work = nullptr;
  }
  u.gathered = true;
  u.prefetched = false;
}

void Zero::release(Unit& u) {
  if (u.keep_gathered || (!u.gathered && !u.ag_work)) return;
  if (u.ag_work) {
    u.ag_work->wait();
    u.ag_work = nullptr;
  }
  release_storage(u.param_flat);
  gathered_bytes_ -= u.param_bytes();
  u.gathered = false;
  u.prefetched = false;
}

void Zero::gather_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& u : units_) gather_start(*u);
  for (auto& u : units_) {
    gather_wait(*u);
    ++u->holds;
  }
}

void Zero::release_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& u : units_) {
    if (u->keep_gathered) continue;
    if (u->holds > 0) --u->holds;
    if (u->holds == 0) release(*u);
  }
}

Zero::Unit* Zero::unit_of_block(int64_t layer) {
  for (auto& u : units_) {
    if (u->block == layer) return u.get();
  }
  return nullptr;
}

// Starts the gathers of the `prefetch` blocks after (direction +1) or before
// (-1) `layer` in forward order, every unit of each.
void Zero::prefetch_after(int64_t layer, int direction) {
  auto it = std::find(block_order_.begin(), block_order_.end(), layer);
  if (it == block_order_.end()) return;
  int64_t pos = it - block_order_.begin();
  for (int k = 1; k <= options_.prefetch; ++k) {
    const int64_t q = pos + direction * k;
    if (q < 0 || q >= static_cast<int64_t>(block_order_.size())) break;
    for (auto& u : units_) {
      if (u->block == block_order_[q] && !u->gathered && !u->ag_work) {
        gather_start(*u);
        u->prefetched = true;
      }
    }
  }
}

// Note [Block hooks and recompute]: the window of a block opens before its
// forward and closes after it; in backward an identity on the block's output
// re-opens it before the block's first backward node (a recompute replay
// runs inside), and an identity on its input closes it after the gradient
// with respect to the input is complete — the block's weight gradients need
// no parameter values, so their accumulation may come later.
at::Tensor Zero::run_block(int64_t layer, const at::Tensor& x, const parallel::BlockFn& run) {
  std::vector<Unit*> units;
  for (auto& u : units_) {
    if (u->block == layer && !u->keep_gathered) units.push_back(u.get());
  }
  if (units.empty()) return run(x);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Unit* u : units) gather_start(*u);
    for (Unit* u : units) {
      gather_wait(*u);
      ++u->holds;
    }
    prefetch_after(layer, +1);
  }
  const bool backward = at::GradMode::is_enabled();
  at::Tensor in = x;
  if (backward && x.requires_grad()) {
    for (Unit* u : units) {
      in = IdentityWithBackwardAction::apply(in, reinterpret_cast<int64_t>(&u->after_backward));
    }
  }
  at::Tensor y;
  try {
    y = run(in);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Unit* u : units) {
      if (--u->holds == 0) release(*u);
    }
    throw;
  }
  if (backward && y.requires_grad()) {
    for (Unit* u : units) y = IdentityWithBackwardAction::apply(y, reinterpret_cast<int64_t>(&u->before_backward));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Unit* u : units) {
    if (--u->holds == 0) release(*u);
  }
  return y;
}

Zero::Memory Zero::memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return memory_;
}

Zero::Stats Zero::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace torus::dp
