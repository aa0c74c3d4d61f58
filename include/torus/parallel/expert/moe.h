// torus/parallel/expert/moe.h — mixture-of-experts layers and expert
// parallelism: a top-k router, a capacity with a deterministic drop policy
// (or none: dropless), token dispatch and combine over the `ep` group with
// uneven all-to-alls, and the auxiliary losses.
//
//   tokens x [s, b, h] (this rank's rows and, under TP, its slice of the sequence)
//     -> router: logits = x Wr^T [n, E] (fp32), p = softmax(logits)
//     -> top-k of p (+ bias, auxiliary-loss-free balancing) -> experts [n, k], gates [n, k]
//     -> statistics of the whole micro-batch (one all-reduce over the token group)
//     -> capacity: keep[n, k] (an all-gather of every assignment over the token group)
//     -> permute by expert, exchange counts, all_to_all(tokens) over ep
//     -> each local expert's MLP on the tokens it received (a loop over experts)
//     -> all_to_all back, inverse permutation, sum of gate x expert output
//
// Note [MoE groups]: the mesh is pp x dp x ep x (cp) x tp. Dense parameters
// are replicated over dp x ep, whose ranks read different rows of the batch
// (the data group, ParallelGroups::dp); an expert lives on one ep rank of
// every dp x tp coordinate, and its gradient is reduced over the ranks that
// hold it (ParallelGroups::expert_dp, expert_dp_tp). Under TP each TP rank
// routes its own 1/tp of the sequence (with sequence parallelism the
// activations are split so already; without it the layer splits them and
// all-gathers the output), so the router's and the experts' gradients are
// partial over TP (ShardSpec::tp_partial_grad: summed over tp). The token
// group (ParallelGroups::tokens = dp x ep x tp) holds, together, exactly the
// tokens of one single-process micro-batch (the engine splits each
// micro-batch over the data ranks, Note [Micro-batch rows] in trainer.cpp).
//
// Note [Expert tensor parallelism]: with MoEConfig::expert_tensor_parallel
// and tp > 1 each expert's MLP is split over TP as a dense MLP is — fc1's
// rows (and bias) and fc2's columns, a 1/tp block each (ShardSpec dim 0 and
// 1); fc2's bias stays replicated with a TP-partial gradient. The TP ranks
// still route different tokens, so after the ep exchange every TP rank
// sends the rows it received to every other one (an all_to_all over tp with
// uneven splits: an all-gather of variable size whose backward sums the
// gradients), each rank runs its block of every local expert on the rows of
// the whole TP group, and the partial outputs go back over tp and are
// summed for the rows this rank owns (a reduce-scatter of variable size).
// The sharded weights' gradients then cover the tokens of the whole TP
// group, so they are reduced over expert_dp alone, like any TP shard.
// Expert memory per rank falls by tp; the price is, per layer and
// direction, an all-gather of the per-expert counts (a host sync) and two
// all_to_alls over tp carrying the tp-fold of each rank's rows (the send
// buffer of the first holds tp copies of them).
//
// Note [Layout-independent routing]: every quantity that depends on more than
// one token is computed over the whole token group, so that any layout
// routes, drops and weights exactly as one process does:
//  * f_e (the share of the k·N assignments that chose expert e, before
//    drops), P_e (the mean router probability of e over the N tokens) and the
//    z-loss mean come from one all-reduce of [counts, sum p, sum lse^2] in f64;
//  * aux = E · sum_e f_e P_e (Switch Transformer / GShard; 1 when balanced),
//    z = mean_t logsumexp(logits_t)^2 (ST-MoE);
//  * the capacity of an expert is C = ceil(capacity_factor · k · N / E) over
//    the group's N tokens, and the assignments an expert keeps are its C
//    first in the order (router probability descending, global token index
//    ascending, slot ascending) — a total order, the same on every device and
//    layout (capacity_keep()). The global token index of position p of row r
//    of the micro-batch is r · seq + p. A dropped assignment contributes
//    nothing: a token all of whose assignments are dropped leaves the layer
//    as zeros, so the block's output is its residual.
//  * The gradient of the auxiliary losses enters backward at the layer's
//    output (an identity whose backward adds d(weight · loss) / d(router), as
//    Megatron-Core's aux-loss scaler does), so it reaches the router from
//    every pipeline stage without the stage returning it. Each rank injects
//    its tokens' part of the group's loss times the data group size (the
//    data-parallel average divides it again) times the engine's loss-gradient
//    scale (1/num_micro, times the fp16 loss scale): set_loss_grad_scale().
//  * Expert parameters' gradients are summed over the ep ranks' tokens by
//    the all-to-all's backward; the reduction over expert_dp averages over dp
//    only, so the layer scales them by 1/ep in backward.
//
// Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias b is added
// to the probabilities for the choice of experts only (gates are the
// unbiased probabilities); after every optimizer step b_e += rate ·
// sign(mean load - load_e) from the step's global counts (end_step()), the
// same on every rank. b is state (checkpointed), not a parameter.
//
// Jitter (Switch Transformer): in training the router's input is multiplied by
// uniform noise in [1 - eps, 1 + eps], drawn for the whole micro-batch from
// the stage's replicated stream and indexed by global token: layout
// independent over tp, dp and ep, not over pipeline cuts (like dropout).
//
// Recompute: a replayed forward (parallel::replaying(), replay.h) routes the same
// tokens again and issues the same collectives, but records no statistics.
//
// Errors: MoEConfig::validate throws InvalidArgument before any
// communication (E < 1, k outside [1, E], E not divisible by ep, negative
// weights or factors). Communication errors surface as CommError /
// TimeoutError from forward or backward.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "torus/parallel/expert/routing_stats.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/random.h"
#include "torus/parallel/tensor/sharding.h"

namespace torus::ep {

struct MoEConfig {
  int64_t num_experts = 8;
  int64_t top_k = 2;
  // Capacity factor; 0: dropless (every assignment is kept, expert batches
  // have whatever size the router gives them).
  double capacity_factor = 0;
  double aux_loss_weight = 1e-2;  // Switch/GShard load-balancing loss
  double z_loss_weight = 0;       // router z-loss (ST-MoE uses 1e-3)
  bool aux_loss_free = false;     // bias balancing instead of (or beside) the aux loss
  double bias_update_rate = 1e-3;
  double jitter = 0;              // multiplicative router-input noise (training only)
  bool normalize_gates = true;    // k > 1: the k gates of a token renormalised to sum to 1
  // Split each expert's MLP over TP (Note [Expert tensor parallelism]);
  // false: every TP rank holds whole experts. ffn_hidden must divide by tp.
  bool expert_tensor_parallel = false;
  int64_t ffn_hidden = 0;         // each expert's MLP width
  int64_t hidden = 0;
  double init_std = 0.02;
  double output_init_std = 0.02;  // fc2 (a residual projection)
  uint64_t seed = 1234;
  c10::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);

  // InvalidArgument naming the problem. Pure.
  void validate(int ep_size) const;
  // C = ceil(capacity_factor x k x tokens / E); -1 when dropless.
  int64_t capacity(int64_t tokens) const;
};

// ---- the pieces, as functions (tests call them directly) -----------------------

// Selection of the router: probs [n, E] (softmax of the logits, fp32),
// experts [n, k] int64 (top-k of probs + bias; bias undefined: none), gates
// [n, k] (probs at the chosen experts, renormalised when asked; differentiable).
struct Routing {
  at::Tensor logits;
  at::Tensor probs;
  at::Tensor experts;
  at::Tensor gates;
  at::Tensor scores;  // [n, k] probs at the chosen experts (the drop order's key), detached
};
Routing route(const at::Tensor& logits, int64_t top_k, bool normalize_gates, const at::Tensor& bias = {});

// The drop policy of Note [Layout-independent routing]: for assignments
// (experts [m, k] int64, scores [m, k], token_index [m] int64 global, unique)
// returns keep [m, k] bool: each expert keeps its `capacity` first
// assignments in the order (score desc, token index asc, slot asc).
// capacity < 0 keeps everything. Pure; no communication.
at::Tensor capacity_keep(const at::Tensor& experts, const at::Tensor& scores, const at::Tensor& token_index,
                         int64_t num_experts, int64_t capacity);

// all_to_all over `group` as an autograd function: rows of x [sum(send), ...]
// go in blocks of send[q] rows to rank q; the result has sum(recv) rows, the
// block from rank q at offset sum(recv[<q]). Its backward is the all_to_all
// of the gradient with the splits swapped. Null group: identity (send ==
// recv). Zero rows anywhere are fine.
at::Tensor all_to_all(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                      const comm::ProcessGroupPtr& group);

// Identity on x whose backward also backpropagates `grad_scale` into the
// scalar `loss` (the auxiliary losses' way into backward).
at::Tensor inject_loss(const at::Tensor& x, const at::Tensor& loss, double grad_scale);

// Seconds this process spent in the token all_to_alls (forward and
// backward, waiting included) since it started: benchmarks take differences.
double token_exchange_seconds();

// Identity whose backward multiplies the gradient by `scale`.
at::Tensor scale_grad(const at::Tensor& x, double scale);

// ---- the layer -----------------------------------------------------------------

// A parameter holder of the layer (a submodule, so that global names read
// "<layer>.router.weight", "<layer>.experts.<global index>.fc1.weight"). Its
// gradients are partial over TP when the layer's tokens are split over TP.
class MoEParameters : public torch::nn::Module, public tp::ShardedModule {
 public:
  explicit MoEParameters(bool expert) : expert_(expert) {}
  // Registers `value` (this TP rank's block when `spec` is sharded).
  at::Tensor add(const std::string& name, at::Tensor value, const tp::ShardSpec& spec) {
    specs_[name] = spec;
    return register_parameter(name, std::move(value));
  }
  tp::ShardSpecs shard_specs() const override { return specs_; }
  // An expert's parameters (reduced over the ranks that hold the expert).
  bool expert() const { return expert_; }

 private:
  bool expert_ = false;
  tp::ShardSpecs specs_;
};

class MoELayer : public torch::nn::Module, public tp::ShardedModule {
 public:
  // `name`: the layer's global prefix ("blocks.3.moe"): the parameters'
  // seeds and the global names of the experts ("experts.<global index>.fc1.weight").
  // `sequence_parallel`: x arrives split along the sequence already.
  MoELayer(const MoEConfig& config, std::string name, int64_t layer, const parallel::ParallelGroups& groups,
           bool sequence_parallel, std::shared_ptr<tp::RngTracker> rng);

  // x [s_local, b, h] -> [s_local, b, h]: the weighted sum of the experts'
  // outputs (zeros for a token whose assignments were all dropped).
  at::Tensor forward(const at::Tensor& x);
  tp::ShardSpecs shard_specs() const override;

  int64_t layer() const { return layer_; }
  int64_t first_expert() const { return first_expert_; }
  int64_t local_experts() const { return local_experts_; }
  const MoEConfig& config() const { return config_; }

  // Gradient scale of the auxiliary losses (the engine's 1/num_micro x loss scale).
  void set_loss_grad_scale(double scale) { loss_grad_scale_ = scale; }
  // The statistics of the training forwards since the last call (summed over
  // micro-batches, over the whole token group), and — with
  // auxiliary-loss-free balancing and `update_bias` — the bias update from
  // them. Clears the accumulation.
  LayerRoutingStats end_step(bool update_bias);
  // Auxiliary-loss-free balancing's bias [E] (f32, replicated); undefined otherwise.
  const at::Tensor& bias() const { return bias_; }

 private:
  // Rows grouped by local expert (counts per_expert) -> the experts' outputs.
  at::Tensor run_experts(const at::Tensor& x, const std::vector<int64_t>& per_expert);
  // The same with each expert split over TP (Note [Expert tensor parallelism]).
  at::Tensor run_experts_tp(const at::Tensor& x, const std::vector<int64_t>& per_expert);
  // Expert i's MLP on x; `bias2`: add fc2's bias (false: the TP-partial output).
  at::Tensor expert_mlp(int64_t local_expert, const at::Tensor& x, bool bias2 = true);

  MoEConfig config_;
  std::string name_;
  int64_t layer_ = 0;
  parallel::ParallelGroups groups_;
  bool sequence_parallel_ = false;
  std::shared_ptr<tp::RngTracker> rng_;
  int ep_size_ = 1, ep_rank_ = 0;
  int64_t first_expert_ = 0, local_experts_ = 0;
  bool expert_tp_ = false;  // experts split over TP (tp > 1 and config_.expert_tensor_parallel)
  double loss_grad_scale_ = 1.0;
  at::Tensor router_;  // [E, h]
  struct Expert {
    at::Tensor fc1_w, fc1_b, fc2_w, fc2_b;  // [f, h], [f], [h, f], [h] (f / tp under expert TP)
  };
  std::vector<Expert> experts_;  // the local ones, in global order
  at::Tensor bias_;
  LayerRoutingStats acc_;
};

}  // namespace torus::ep
