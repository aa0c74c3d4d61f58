// ZeRO gradients (zero.h): each parameter's gradient is added into its
// unit's full-size buffer from the post-accumulation hook; a unit whose
// parameters have all arrived is reduce-scattered in place, at most
// max_inflight at a time, and its block added into this rank's shard.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>

#include "parallel/data/zero_unit.h"

namespace torus::dp {

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

}  // namespace torus::dp
