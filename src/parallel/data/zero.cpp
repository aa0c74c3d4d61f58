// ZeRO stages 1-3 (zero.h): the names of the offload modes, and a Zero's
// construction — parameters grouped into units of flat buffers, this rank's
// segments, the post-accumulation hooks — and its queries. The gradients'
// reduce-scatter is in zero_grads.cpp, the parameters' gathers (after the
// step, or around every block for stage 3) in zero_params.cpp.
#include "torus/parallel/data/zero.h"

#include <ATen/Functions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "parallel/data/ready_hook.h"
#include "parallel/data/zero_unit.h"

namespace torus::dp {

std::string ZeroSegment::key() const { return fmt::format("{}[{}:{}]", name, offset, offset + numel); }

Zero::Zero(std::vector<ZeroParameter> params, const parallel::ParallelGroups& groups, ZeroOptions options)
    : groups_(groups), options_(options) {
  dp::check_zero_stage(options_.stage, options_.offload);
  TORUS_CHECK(options_.stage >= 1, InvalidArgument, "ZeRO: a Zero object shards: stage must be 1, 2 or 3, got {}",
              options_.stage);
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

Zero::Memory Zero::memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return memory_;
}

Zero::Stats Zero::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace torus::dp
