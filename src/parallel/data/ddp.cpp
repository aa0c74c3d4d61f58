// Data parallelism (ddp.h): gradients as views of flat buckets, bucket
// all-reduces started from post-accumulation hooks, finished at the end of
// backward or in finish_grad_sync().
#include "torus/parallel/data/ddp.h"

#include <ATen/Functions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <map>
#include <tuple>

#include "core/log.h"
#include "parallel/data/ready_hook.h"
#include "torus/parallel/backward_callback.h"

namespace torus::dp {
namespace {

at::Tensor slot_view(const Bucket& b, const BucketSlot& s) {
  return b.flat.narrow(0, s.offset, s.numel).view(s.param.sizes());
}

// Makes param.grad the bucket view; keeps a gradient found elsewhere. A
// separate slot (Note [Main gradients]) takes the gradient in: added into
// the slice, .grad reset.
bool install_view(const Bucket& b, const BucketSlot& s) {
  at::Tensor view = slot_view(b, s);
  at::Tensor& grad = const_cast<at::Tensor&>(s.param).mutable_grad();
  if (s.separate) {
    if (!grad.defined()) return false;
    view.add_(grad.view(view.sizes()));
    grad = at::Tensor();
    return false;
  }
  if (grad.defined() && grad.data_ptr() == view.data_ptr() && grad.sizes() == view.sizes()) return false;
  if (grad.defined()) {
    view.copy_(grad);
  } else {
    view.zero_();
  }
  grad = view;
  return true;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 const parallel::ParallelGroups& groups, const DDPOptions& options)
    : module_(std::move(module)), groups_(groups), options_(options) {
  TORUS_CHECK(module_ != nullptr, InvalidArgument, "DistributedDataParallel: null module");
  const tp::ShardSpecs specs = tp::collect_shard_specs(*module_);
  std::vector<NamedParameter> params;
  for (const auto& item : module_->named_parameters()) {
    auto it = specs.find(item.key());
    params.push_back({item.key(), item.value(), it == specs.end() ? tp::ShardSpec{} : it->second});
  }
  init(std::move(params));
}

DistributedDataParallel::DistributedDataParallel(std::vector<NamedParameter> params,
                                                 const parallel::ParallelGroups& groups, const DDPOptions& options)
    : groups_(groups), options_(options) {
  init(std::move(params));
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void DistributedDataParallel::init(std::vector<NamedParameter> params) {
  reducer_ = std::make_unique<AllReduceReducer>();
  const int dp = groups_.dp_size();
  const int tp = groups_.tp_size();

  // The group that reduces tp_partial_grad parameters: sum over TP, over dp too.
  comm::ProcessGroupPtr partial_group = groups_.dp_tp;
  if (!partial_group) {
    partial_group = tp == 1 ? groups_.dp : dp == 1 ? groups_.tp : nullptr;
  }

  // Bucket keys: (dtype, device, which group).
  std::vector<NamedParameter> hooked;
  std::vector<ParamDesc> descs;
  std::map<std::tuple<int, std::string, int>, int> keys;
  for (auto& p : params) {
    TORUS_CHECK(p.tensor.defined(), InvalidArgument, "DistributedDataParallel: parameter '{}' is undefined", p.name);
    if (!p.tensor.requires_grad()) continue;
    const bool partial = p.spec.tp_partial_grad;
    if (partial && tp > 1 && dp > 1) {
      TORUS_CHECK(partial_group != nullptr, InvalidArgument,
                  "DistributedDataParallel: parameter '{}' has gradients partial over TP and needs the dp x tp group "
                  "(ParallelGroups::dp_tp; ParallelGroups::from_mesh sets it)",
                  p.name);
    }
    const comm::ProcessGroupPtr& g = partial ? partial_group : groups_.dp;
    const c10::ScalarType gdt = grad_dtype_of(p.tensor);
    const bool local = parallel::group_size(g) == 1;
    if (local && gdt == p.tensor.scalar_type()) {
      unbucketed_.push_back(p.tensor);
      continue;
    }
    auto key = std::make_tuple(static_cast<int>(gdt), p.tensor.device().str(), local ? 2 : partial ? 1 : 0);
    auto [it, added] = keys.emplace(key, static_cast<int>(keys.size()));
    descs.push_back({p.tensor.numel(), static_cast<int64_t>(c10::elementSize(gdt)), it->second});
    hooked.push_back(std::move(p));
  }

  // Gradients become ready roughly in reverse registration order.
  std::reverse(hooked.begin(), hooked.end());
  std::reverse(descs.begin(), descs.end());
  auto plans = plan_buckets(descs, {options_.bucket_cap_bytes, options_.first_bucket_cap_bytes, 1});

  slot_refs_.resize(hooked.size());
  // Shared CPU buckets are slices of one allocation, 64-byte aligned: the
  // peers then map one region per rank, not one per bucket.
  auto is_local = [&](const BucketPlan& plan) {
    const NamedParameter& p = hooked[plan.params.front()];
    return parallel::group_size(p.spec.tp_partial_grad ? partial_group : groups_.dp) == 1;
  };
  auto shared_bucket = [&](const BucketPlan& plan) {
    const at::Tensor& first = hooked[plan.params.front()].tensor;
    return options_.shared_host_buckets && first.device().is_cpu() && !is_local(plan);
  };
  auto padded_bytes = [&](const BucketPlan& plan) {
    const int64_t bytes = plan.numel * static_cast<int64_t>(c10::elementSize(grad_dtype_of(hooked[plan.params.front()].tensor)));
    return (bytes + 63) / 64 * 64;
  };
  int64_t shared_bytes = 0;
  for (const auto& plan : plans) {
    if (shared_bucket(plan)) shared_bytes += padded_bytes(plan);
  }
  at::Tensor shared_raw = shared_bytes > 0 ? comm::shared_host_zeros({shared_bytes}, at::kByte) : at::Tensor();
  int64_t shared_at = 0;
  for (const auto& plan : plans) {
    Bucket b;
    b.index = static_cast<int>(buckets_.size());
    const at::Tensor& first = hooked[plan.params.front()].tensor;
    const c10::ScalarType gdt = grad_dtype_of(first);
    if (shared_bucket(plan)) {
      b.flat = shared_raw.narrow(0, shared_at, plan.numel * static_cast<int64_t>(c10::elementSize(gdt))).view(gdt);
      shared_at += padded_bytes(plan);
    } else {
      b.flat = at::zeros({plan.numel}, first.options().dtype(gdt).requires_grad(false));
    }
    const bool partial = hooked[plan.params.front()].spec.tp_partial_grad;
    b.group = is_local(plan) ? nullptr : partial ? partial_group : groups_.dp;
    if (partial) {
      b.op = comm::ReduceOp::kSum;  // the TP part is a true sum; the dp part may be averaged
      b.post_scale = options_.average ? 1.0 / dp : 1.0;
    } else {
      b.op = options_.average ? comm::ReduceOp::kAvg : comm::ReduceOp::kSum;
    }
    for (size_t j = 0; j < plan.params.size(); ++j) {
      const NamedParameter& p = hooked[plan.params[j]];
      slot_refs_[plan.params[j]] = {b.index, static_cast<int>(b.slots.size())};
      by_param_[p.tensor.unsafeGetTensorImpl()] = slot_refs_[plan.params[j]];
      b.slots.push_back({p.name, p.tensor, plan.offsets[j], p.tensor.numel(), gdt != p.tensor.scalar_type()});
    }
    b.pending = static_cast<int>(b.slots.size());
    buckets_.push_back(std::move(b));
  }
  for (const auto& b : buckets_) {
    for (const auto& s : b.slots) install_view(b, s);
  }
  for (size_t i = 0; i < hooked.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(hooked[i].tensor);
    TORUS_CHECK(acc != nullptr, InvalidArgument, "DistributedDataParallel: parameter '{}' is not a leaf",
                hooked[i].name);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<ReadyHook>([this, i] { on_grad_ready(i); })));
    accumulators_.push_back(std::move(acc));
  }
  int64_t total = 0;
  for (const auto& b : buckets_) total += b.flat.numel();
  TORUS_LOG_DEBUG("DDP: {} parameters in {} buckets ({} elements), {} not reduced (groups of one rank)", hooked.size(),
                  buckets_.size(), total, unbucketed_.size());
  if (options_.broadcast_parameters) broadcast_parameters();
}

void DistributedDataParallel::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  const SlotRef ref = slot_refs_[index];
  Bucket& b = buckets_[ref.bucket];
  if (install_view(b, b.slots[ref.slot])) ++stats_.grads_restored;
  if (!sync_enabled_) return;
  TORUS_CHECK(b.work == nullptr, Error,
              "DDP: parameter '{}' produced a gradient after its bucket {} started reducing; run one backward per "
              "synchronisation (use no_sync() to accumulate)",
              b.slots[ref.slot].name, b.index);
  iteration_active_ = true;
  --b.pending;
  if (options_.finish_in_backward && !callback_queued_) {
    // Runs on the engine once backward is over: waits for (and starts) every
    // bucket. Queued on the outermost backward: a hook that fires inside a
    // recompute's inner backward must not finish the buckets when that inner
    // pass ends (Note [Inner backward], backward_callback.h).
    callback_queued_ = true;
    parallel::queue_after_backward([this] { finish_grad_sync(); });
  }
  if (options_.overlap) start_ready_buckets_locked();
}

void DistributedDataParallel::start_ready_buckets_locked() {
  while (next_to_start_ < buckets_.size() && buckets_[next_to_start_].pending == 0) {
    start_bucket_locked(buckets_[next_to_start_++], /*from_hook=*/true);
  }
}

void DistributedDataParallel::start_bucket_locked(Bucket& bucket, bool from_hook) {
  if (!from_hook) {
    // Some gradients never arrived in this backward (unused parameters): a
    // grad set to None meanwhile reads as zeros, and is the view again.
    for (const auto& s : bucket.slots) {
      if (install_view(bucket, s)) ++stats_.grads_restored;
    }
  }
  if (!bucket.group) return;  // a local bucket (Note [Main gradients]): nothing to reduce
  bucket.work = reducer_->start(bucket);
  ++(from_hook ? stats_.buckets_started_in_backward : stats_.buckets_started_late);
}

void DistributedDataParallel::start_all_locked() {
  while (next_to_start_ < buckets_.size()) start_bucket_locked(buckets_[next_to_start_++], /*from_hook=*/false);
}

void DistributedDataParallel::start_grad_sync() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_enabled_) return;
  iteration_active_ = true;
  start_all_locked();
}

void DistributedDataParallel::finish_grad_sync() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_enabled_ || !iteration_active_) return;
  start_all_locked();
  // Whatever happens, the next iteration starts clean.
  struct Reset {
    DistributedDataParallel* self;
    ~Reset() { self->reset_iteration_locked(); }
  } reset{this};
  for (auto& b : buckets_) {
    if (!b.group) continue;
    b.work->wait();
    reducer_->finish(b);
  }
  ++stats_.syncs;
}

void DistributedDataParallel::reset_iteration_locked() {
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.slots.size());
    b.work = nullptr;
  }
  next_to_start_ = 0;
  callback_queued_ = false;
  iteration_active_ = false;
}

void DistributedDataParallel::zero_grad(bool set_to_none) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& b : buckets_) {
    bool separate = false;
    for (const auto& s : b.slots) separate |= s.separate;
    if (separate) {
      // Main gradients cannot be "None": the slices are zeroed.
      b.flat.zero_();
      for (const auto& s : b.slots) {
        if (s.separate || set_to_none) {
          const_cast<at::Tensor&>(s.param).mutable_grad() = at::Tensor();
        } else {
          install_view(b, s);
        }
      }
    } else if (set_to_none) {
      for (const auto& s : b.slots) const_cast<at::Tensor&>(s.param).mutable_grad() = at::Tensor();
    } else {
      b.flat.zero_();
      for (const auto& s : b.slots) install_view(b, s);
    }
  }
  for (auto& t : unbucketed_) {
    if (!t.grad().defined()) continue;
    if (set_to_none) {
      t.mutable_grad() = at::Tensor();
    } else {
      t.mutable_grad().zero_();
    }
  }
}

void DistributedDataParallel::set_grad_sync_enabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_enabled_ = enabled;
}

void DistributedDataParallel::broadcast_parameters() {
  if (groups_.dp_size() == 1) return;
  at::NoGradGuard no_grad;
  std::vector<comm::WorkPtr> works;
  std::vector<at::Tensor> staged;
  auto each = [&](const at::Tensor& param) {
    // A new TensorImpl over the parameter's storage: the Work must not hold a
    // tensor that may have a Python object (Note [Tensors from Python]).
    at::Tensor t =
        at::empty({0}, param.options()).set_(param.storage(), param.storage_offset(), param.sizes(), param.strides());
    if (t.is_contiguous()) {
      works.push_back(groups_.dp->broadcast(t));
    } else {
      staged.push_back(t);
    }
  };
  for (const auto& b : buckets_) {
    for (const auto& s : b.slots) each(s.param);
  }
  for (const auto& t : unbucketed_) each(t);
  for (auto& w : works) w->wait();
  for (auto& t : staged) {
    at::Tensor c = t.contiguous();
    groups_.dp->broadcast(c)->wait();
    t.copy_(c);  // writes the parameter's storage through the alias
  }
}

void DistributedDataParallel::set_reducer(std::unique_ptr<BucketReducer> reducer) {
  TORUS_CHECK(reducer != nullptr, InvalidArgument, "DDP: null reducer");
  std::lock_guard<std::mutex> lock(mu_);
  TORUS_CHECK(!iteration_active_, InvalidArgument, "DDP: cannot replace the reducer during a synchronisation");
  reducer_ = std::move(reducer);
}

at::Tensor DistributedDataParallel::grad(const at::Tensor& param) const {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  if (it == by_param_.end()) return param.grad();
  const Bucket& b = buckets_[it->second.bucket];
  const BucketSlot& s = b.slots[it->second.slot];
  return s.separate ? slot_view(b, s) : param.grad();
}

comm::ProcessGroupPtr DistributedDataParallel::reduce_group(const at::Tensor& param) const {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  return it == by_param_.end() ? nullptr : buckets_[it->second.bucket].group;
}

c10::ScalarType DistributedDataParallel::grad_dtype_of(const at::Tensor& param) const {
  if (options_.grad_dtype && at::isFloatingType(param.scalar_type())) return *options_.grad_dtype;
  return param.scalar_type();
}

DistributedDataParallel::Stats DistributedDataParallel::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace torus::dp
