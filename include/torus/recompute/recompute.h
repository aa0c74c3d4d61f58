// torus/recompute/recompute.h — activation recompute: keep a function's
// input instead of its activations, and run the function again in backward.
//
//   at::Tensor y = torus::recompute::run([&](const at::Tensor& x) { return block->forward(x); },
//                                        x, {.rng_trackers = {model.rng()}});
//
// (The word "checkpoint" means saved training state in Torus; this is
// recompute, never checkpointing.)
//
// Note [Recompute replay]: run() is a reentrant custom autograd function.
// Its forward runs fn under no-grad — no graph, no saved activations — and
// saves only the inputs plus what the replay needs (below). Its backward
//  1. makes a detached copy of every input (requires_grad as the original),
//  2. restores the state of the original forward: the streams of the given
//     RngTrackers and the framework generators (the CPU default generator,
//     and the default generator of the inputs' accelerator device), grad mode
//     (on), autocast (enabled and dtype, for CPU and the inputs' device, and
//     its weight cache flag), and the ZB-H1 weight-gradient deferral mode
//     (weight_grad.h);
//  3. replays fn with grad enabled, so dropout draws the same masks and the
//     replayed output equals the original bit for bit, with
//     parallel::replaying() true meanwhile (replay.h: layers that record
//     statistics of a forward skip the replay);
//  4. puts every generator back to the state it had before the replay, so
//     whatever runs next (the next micro-batch's forward in a pipeline) draws
//     what it would have drawn without recompute;
//  5. runs torch::autograd::backward(replayed output, incoming gradient) —
//     parameter gradients accumulate into .grad through their usual
//     accumulators, so post-accumulation hooks (the DP buckets) fire as in a
//     plain backward; and returns the detached inputs' gradients.
// Step 5 is an inner backward (Note [Inner backward], backward_callback.h):
// callbacks meant for the end of backward are deferred to the outer one.
// The weight-gradient store of a split backward (WeightGradStoreGuard) is
// thread local and the engine runs the inner backward on the same thread, so
// a replayed deferring linear records into the store of the BI pass that
// runs it, and its weight gradient is computed in the BW pass as usual.
//
// Contracts:
//  * fn must be a function of its inputs, the parameters it reads and the
//    random streams named here, nothing else; it must not change any state
//    the replay depends on. It runs twice (forward, backward) and must issue
//    the same collectives both times (every rank of its groups replays).
//  * fn, and everything it captures, must stay valid until the backward of
//    every output has run (the node holds fn).
//  * Without grad mode (evaluation), run() just calls fn.
//  * When no input requires grad, a zero-size leaf that requires grad joins
//    the inputs, so that the node is part of the graph and the parameters
//    inside fn still get gradients.
//  * Not thread safe with other users of the same RngTrackers or generators
//    while a replay runs (neither are the trackers themselves).
//  * Errors: InvalidArgument for an empty fn, no or undefined inputs, a null
//    tracker; anything fn throws propagates (from backward() for the replay).
//  * With CUDA tensors the engine runs this node and its inner backward on
//    the device's autograd thread: the captured modes are restored there,
//    but a WeightGradStoreGuard installed on the thread that called
//    backward() is not visible to it — as for every deferring linear run by
//    that thread, the weight gradient is then accumulated at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace torus::tp {
class RngTracker;
}

namespace torus::recompute {

// Which activations a model recomputes in backward instead of storing.
// A value: compare, copy, parse, print. Build with the factories or parse().
struct Policy {
  enum class Kind {
    kNone,       // store everything
    kFull,       // every transformer block: keep only its input
    kEvery,      // blocks whose global layer index is a multiple of every_k
    kSelective,  // only each block's attention core (scores, softmax, dropout, x V)
  };
  Kind kind = Kind::kNone;
  int64_t every_k = 0;  // kEvery only: >= 1

  static Policy none() { return {}; }
  static Policy full() { return {Kind::kFull, 0}; }
  static Policy every(int64_t k);  // InvalidArgument unless k >= 1
  static Policy selective() { return {Kind::kSelective, 0}; }

  // "none", "full", "every:K" (K >= 1, decimal) or "selective"; throws
  // InvalidArgument naming the accepted forms for anything else.
  static Policy parse(std::string_view text);
  // The parse() form: parse(p.name()) == p.
  std::string name() const;
  // InvalidArgument unless the fields form one of the policies above.
  void validate() const;

  bool enabled() const { return kind != Kind::kNone; }
  // Whether the block with this GLOBAL layer index (its place in the whole
  // model, not in a pipeline stage) runs under run(). every:K counts from the
  // whole model's layer 0, so every pipeline layout recomputes the same blocks.
  bool recompute_block(int64_t global_layer) const;
  // Whether a block recomputes only its attention core (selective recompute,
  // Korthikanti et al., "Reducing Activation Recomputation in Large
  // Transformer Models", 2022).
  bool recompute_attention_core() const { return kind == Kind::kSelective; }

  bool operator==(const Policy&) const = default;
};

// What the replay restores besides the framework's own generators and the
// thread-local modes (Note [Recompute replay]).
struct RecomputeState {
  // Dropout streams fn draws from; each is snapshotted at the forward and
  // restored for the replay. Kept alive by the autograd node.
  std::vector<std::shared_ptr<tp::RngTracker>> rng_trackers;
};

using Function = std::function<at::Tensor(const at::Tensor&)>;
using MultiFunction = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// y = fn(input), storing only `input` for backward (Note [Recompute replay]).
at::Tensor run(Function fn, const at::Tensor& input, RecomputeState captures = {});
// y = fn(inputs), storing only `inputs` (e.g. q, k, v of an attention core).
at::Tensor run(MultiFunction fn, std::vector<at::Tensor> inputs, RecomputeState captures = {});

}  // namespace torus::recompute
