// torus/parallel/tensor/random.h — seeds and random streams that behave the
// same in every parallel layout.
//
// Note [Dropout RNG rule]: under tensor parallelism an activation is either
// replicated on every rank of the TP group (the hidden states [s, b, h]
// outside sequence parallelism) or sharded over it (attention probabilities,
// whose heads are split; every tensor inside a sequence-parallel region, whose
// sequence is split). Dropout must
//  * draw the SAME mask on every TP rank for a replicated activation — else the
//    copies drift apart and the ranks no longer compute one model — and
//  * draw DIFFERENT masks on different TP ranks for a sharded one — else every
//    shard repeats the same pattern and the mask is not independent.
// RngTracker holds one stream per case: replicated() is seeded from the model
// seed only; sharded() from the model seed and the TP rank. Data-parallel
// replicas share both streams (they see different data). The choice is made
// by the model at each dropout site, never by a global flag.
//
// Layout-independent initialisation (Note [Layout-independent init]):
// a parameter's full TP=1 value is drawn from a CPU generator seeded with
// derive_seed(model seed, parameter name); a rank keeps its slice. The shard a
// rank holds is therefore exactly the matching slice of the single-process
// weight for any TP size, pipeline cut or construction order.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string_view>

namespace torus::tp {

// A stable 64-bit mix of a seed and a name (FNV-1a of the name, then
// splitmix64): the same on every platform and run.
uint64_t derive_seed(uint64_t seed, std::string_view name);

// A new generator for `device` seeded with `seed` (CPU, or the device's own
// generator type, e.g. CUDA's Philox).
at::Generator make_generator(uint64_t seed, c10::Device device = c10::Device(c10::kCPU));

enum class RngRegion {
  kReplicated,  // activation replicated over TP: same stream on every TP rank
  kSharded,     // activation sharded over TP (heads or sequence): per-rank stream
};

// The dropout streams of one model replica (Note [Dropout RNG rule]). Owned by
// the model and shared with its layers. Not thread safe: one forward at a time.
class RngTracker {
 public:
  // `stage` separates pipeline stages (their layers are different; their
  // streams should be too); 0 without pipeline parallelism.
  RngTracker(uint64_t seed, int tp_rank, c10::Device device = c10::Device(c10::kCPU), int stage = 0);

  at::Generator& generator(RngRegion region) { return region == RngRegion::kReplicated ? replicated_ : sharded_; }

  // Snapshot and restore both streams (activation recomputation replays the
  // forward with the same masks).
  struct State {
    at::Tensor replicated;
    at::Tensor sharded;
  };
  State get_state() const;
  void set_state(const State& state);

 private:
  at::Generator replicated_;
  at::Generator sharded_;
};

// Inverted dropout with an explicit generator: x * mask / (1 - p), mask ~
// Bernoulli(1 - p). Identity when !training or p == 0. Throws InvalidArgument
// unless 0 <= p < 1.
at::Tensor dropout(const at::Tensor& x, double p, bool training, at::Generator& generator);

}  // namespace torus::tp
