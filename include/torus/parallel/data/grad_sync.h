// torus/parallel/data/grad_sync.h — the gradient-synchronisation seam of the
// training engine.
//
// A GradSync owns how the gradients of a model replica are reduced over the
// data-parallel ranks (and, for parameters whose gradients are partial over
// TP, over tp too): DDP's bucketed all-reduce implements it today
// (DistributedDataParallel); ZeRO-1/2/3 reduce-scatter implements it next.
// The engine drives every implementation the same way in each step:
//
//   sync.set_sync_enabled(false);   // accumulation passes: backward only accumulates
//   ... backward of micro-batches 0 .. m-2 ...
//   sync.set_sync_enabled(true);    // the last pass: hooks start reductions as gradients complete
//   ... backward of micro-batch m-1 ...
//   sync.start(); sync.finish();    // whatever is left; afterwards grad(p) is reduced
//   ... clip (counting each element once), optimizer step reading grad(p) ...
//   sync.clear_grads();
//
// Contracts:
//  * start() is non-blocking; finish() blocks until every reduction of the
//    step completed; both are no-ops when nothing happened since the last
//    finish. Reductions never complete inside a recompute's inner backward
//    (recompute.h).
//  * grad(p) is the gradient the optimizer must read for parameter p after
//    finish(): p.grad() itself, or a main-gradient buffer of another dtype
//    (f32 accumulation for half-precision parameters). Undefined when p
//    received no gradient and the implementation keeps none.
//  * reduce_group(p): the group p's gradient is reduced over (null: none);
//    gradient clipping uses it to count every element once.
//  * Communication errors propagate from backward(), start() or finish() as
//    torus::CommError / TimeoutError.
#pragma once

#include <ATen/core/Tensor.h>

#include "torus/comm/process_group.h"

namespace torus::dp {

class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual void set_sync_enabled(bool enabled) = 0;
  virtual void start() = 0;
  virtual void finish() = 0;
  virtual void clear_grads() = 0;  // between steps: the next backward starts from zero
  virtual at::Tensor grad(const at::Tensor& param) const = 0;
  virtual comm::ProcessGroupPtr reduce_group(const at::Tensor& param) const = 0;
};

}  // namespace torus::dp
