// torus/parallel/tensor/weight_grad.h — deferred weight gradients for
// zero-bubble pipeline schedules.
//
// Note [Deferred weight gradients]: ZB-H1 splits a stage's backward into the
// input gradient (BI, on the critical path: the previous stage waits for it)
// and the weight gradient (BW, scheduled later to fill the bubble). For a
// linear layer y = x W^T + b the two are separate matmuls: dx = dy W needs
// only dy, while dW = dy^T x and db = sum(dy) can wait. The TP layers compute
// their matmul through tp::linear(); a linear built while deferral is enabled
// (DeferWeightGradGuard, at forward time) runs an autograd node whose
// backward computes dx only and records (W, b, x, dy) in the WeightGradStore
// installed on the thread (WeightGradStoreGuard, at backward time).
// WeightGradStore::flush() later computes every recorded dW and db and
// accumulates them through the parameters' own autograd accumulators
// (torch::autograd::backward on the leaves), so post-accumulation hooks —
// the DP wrapper's bucket hooks — fire exactly as in a fused backward.
// Every other parameter (LayerNorm, embeddings, biases outside tp::linear)
// gets its gradient in BI as usual; those are cheap.
//
// Without a store installed, a deferred node's backward accumulates its
// weight gradient at once (a re-entrant backward on the leaves), so a model
// built under deferral still trains correctly in a fused backward.
//
// Threading: both guards are thread-local; the store itself is not thread
// safe (one backward at a time, as autograd's CPU engine runs it).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace torus::tp {

class WeightGradStore {
 public:
  // Records one deferred gradient (called from the autograd node).
  void push(at::Tensor weight, at::Tensor bias, at::Tensor input, at::Tensor grad_output);
  // Computes every recorded weight (and bias) gradient and accumulates it into
  // the parameters through autograd, in recording order; then empties the
  // store. A no-op when empty.
  void flush();
  void clear() { entries_.clear(); }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    at::Tensor weight, bias, input, grad_output;
  };
  std::vector<Entry> entries_;
};

// While alive, tp::linear() on this thread builds deferring nodes (when
// `enabled`). Restores the previous state on destruction.
class DeferWeightGradGuard {
 public:
  explicit DeferWeightGradGuard(bool enabled = true);
  ~DeferWeightGradGuard();
  DeferWeightGradGuard(const DeferWeightGradGuard&) = delete;
  DeferWeightGradGuard& operator=(const DeferWeightGradGuard&) = delete;

 private:
  bool previous_;
};
bool weight_grad_deferral_enabled();

// While alive, deferring nodes running their backward on this thread record
// into `store` (null: accumulate at once). Restores the previous store.
class WeightGradStoreGuard {
 public:
  explicit WeightGradStoreGuard(WeightGradStore* store);
  ~WeightGradStoreGuard();
  WeightGradStoreGuard(const WeightGradStoreGuard&) = delete;
  WeightGradStoreGuard& operator=(const WeightGradStoreGuard&) = delete;

 private:
  WeightGradStore* previous_;
};

// y = x W^T + b (bias may be undefined). Deferring when enabled and W
// requires grad; otherwise at::linear. Under autocast the deferred node's
// backward computes in the forward's (output gradient's) dtype and returns
// dx, dW and db in the dtypes of x, W and b.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

}  // namespace torus::tp
