// torus/parallel/block_hooks.h — a seam around each transformer block's
// forward, for components that must act at block boundaries (ZeRO-3 gathers a
// block's parameters before it runs, in forward and again in backward, and
// frees them after).
//
// A model that supports hooks (engine::StageModule::set_block_hooks) calls,
// for every block it runs,
//   x = hooks->run_block(layer, x, run);
// instead of x = run(x), where `run` is the block's whole forward —
// activation recompute included (the recompute wrapper sits inside the hook,
// so a replay in backward happens while the hook's backward-time state
// holds: Note [Block hooks and recompute] in zero_params.cpp).
//
// Contract for implementations: call run(x) exactly once and return its
// result (or an identity of it, e.g. a tensor routed through an autograd
// function whose backward acts before the block's backward).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace torus::parallel {

using BlockFn = std::function<at::Tensor(const at::Tensor&)>;

class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  // `layer`: the block's global index (engine::StageParameter::block).
  virtual at::Tensor run_block(int64_t layer, const at::Tensor& x, const BlockFn& run) = 0;
};

}  // namespace torus::parallel
