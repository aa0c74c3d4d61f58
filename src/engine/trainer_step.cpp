// The training and evaluation steps of a Trainer: which rows this rank
// reads, one step (pipeline, gradient sync, clipping, the update) and one
// evaluation.
#include "engine/trainer_impl.h"

namespace torus::engine {

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

at::Tensor StageModule::full_logits(const at::Tensor& /*output*/, const comm::ProcessGroupPtr& /*tp*/) {
  throw Unsupported("this model's stages do not give their logits (StageModule::full_logits)");
}

at::Tensor Trainer::logits(const at::Tensor& batch) {
  Impl& m = *impl_;
  TORUS_CHECK(m.model->gives_logits(), Unsupported, "Trainer::logits: the {} model's stages do not give their logits",
              m.model->name());
  m.load_batch(batch, "logits");
  std::map<int, at::Tensor> captured;
  m.captured_logits = &captured;
  struct Reset {
    std::map<int, at::Tensor>*& p;
    ~Reset() { p = nullptr; }
  } reset{m.captured_logits};
  m.run_eval();
  const at::ScalarType dtype = m.model->param_dtype() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t rows = batch.size(0), seq = batch.size(1) - 1;
  // [vocab] from the last pipeline rank, so that every rank can receive.
  at::Tensor vocab = at::zeros({1}, at::TensorOptions().dtype(at::kLong));
  at::Tensor full;
  if (m.rank == m.P - 1) {
    std::vector<at::Tensor> parts;
    for (auto& [micro, t] : captured) parts.push_back(t.to(dtype));
    at::Tensor local = at::cat(parts, 0);  // this data rank's rows, in local_rows() order
    vocab.fill_(local.size(2));
    const int D = m.groups.dp_size();
    at::Tensor gathered = local;
    if (D > 1) {
      gathered = at::empty({D * local.size(0), seq, local.size(2)}, local.options());
      m.groups.dp->all_gather(local, gathered)->wait();
    }
    // Data rank d's j-th local row is global row micro x (rows / M) + d x b + i (Note [Micro-batch rows]).
    const int64_t M = m.layout.num_micro, per_micro = rows / M, b = local.size(0) / M;
    std::vector<int64_t> dest;
    dest.reserve(static_cast<size_t>(rows));
    for (int d = 0; d < D; ++d) {
      for (int64_t mi = 0; mi < M; ++mi) {
        for (int64_t i = 0; i < b; ++i) dest.push_back(mi * per_micro + d * b + i);
      }
    }
    full = at::empty_like(gathered).index_copy_(0, at::tensor(dest, at::TensorOptions().dtype(at::kLong)), gathered);
  }
  if (m.P > 1) {
    m.eval_group->broadcast(vocab, {.root = m.P - 1})->wait();
    if (m.rank != m.P - 1) full = at::empty({rows, seq, vocab.item<int64_t>()}, at::TensorOptions().dtype(dtype));
    m.eval_group->broadcast(full, {.root = m.P - 1})->wait();
  }
  return full;
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

}  // namespace torus::engine
