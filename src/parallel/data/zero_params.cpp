// ZeRO parameters (zero.h): the all-gathers after the step (stages 1-2),
// and for stage 3 the windows in which a block's parameters are gathered —
// around its forward and again around its backward — with prefetch of the
// next blocks, and the release of their storage outside the windows.
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>

#include "parallel/data/zero_unit.h"

namespace torus::dp {
namespace {

// Identity in forward; `fn` runs when the gradient reaches the node in
// backward. `fn` is smuggled through the context as an index into a table
// owned by the caller (autograd contexts hold IValues only).
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

}  // namespace

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

}  // namespace torus::dp
