// The block loop of the decoders (gpt.cpp, llama.cpp): each block in order,
// wrapped by activation recompute where the policy says (by global layer
// index) and by the block hooks (ZeRO-3 gathers a block's parameters there).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "torus/parallel/block_hooks.h"
#include "torus/parallel/tensor/random.h"
#include "torus/recompute/recompute.h"

namespace torus::models {

template <class Block>
at::Tensor run_blocks(const std::vector<std::shared_ptr<Block>>& blocks, int64_t first_layer,
                      const recompute::Policy& policy, const std::shared_ptr<tp::RngTracker>& rng,
                      const std::shared_ptr<parallel::BlockHooks>& hooks, at::Tensor x) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::shared_ptr<Block>& block = blocks[i];
    const int64_t layer = first_layer + static_cast<int64_t>(i);
    parallel::BlockFn run;
    if (policy.recompute_block(layer)) {
      // Keep only the block's input; its forward runs again in backward with
      // the same dropout masks (Note [Recompute replay]).
      run = [block, rng](const at::Tensor& h) {
        return recompute::run([block](const at::Tensor& in) { return block->forward(in); }, h,
                              {.rng_trackers = {rng}});
      };
    } else {
      run = [block](const at::Tensor& h) { return block->forward(h); };
    }
    x = hooks ? hooks->run_block(layer, x, run) : run(x);
  }
  return x;
}

}  // namespace torus::models
