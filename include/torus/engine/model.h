// torus/engine/model.h — the model seam of the training engine: what a model
// cut into pipeline stages provides to engine::Trainer.
//
// The engine knows models only through these two interfaces. A model
// (engine::Model) describes itself — sizes, FLOPs, how it cuts into stages —
// and builds, for this rank, the StageModule of each pipeline stage the rank
// holds, sharded over the tensor-parallel group it is given. The reference
// GPT is the first implementation (gpt_model.h: GPTModel); Llama-family
// and MoE models plug in the same way.
//
// Contracts:
//  * Layout independence: with the same seed, the shards a StageModule holds
//    are slices of the single-process model's parameters, whatever tp, pp or
//    the cut (the correctness contract of DESIGN.md rests on this).
//  * Global names: StageParameter::name is the parameter's name in the
//    single-process model ("blocks.3.fc1.weight"): optimizer state,
//    state_dict() and checkpoints are keyed by it. Parameters held by two
//    stages (a tied word embedding on the first and the last stage) carry
//    the same tie_key; the copy that is not the owner names itself
//    ("head.output") and sets tie_copy. The engine adds the copies'
//    gradients and counts the owner once.
//  * forward(): the first stage takes tokens [b, s] (int64), every other
//    stage the previous stage's output; one tensor of one shape per edge and
//    micro-batch size (pipeline Note [Shape agreement]). loss() on the last
//    stage returns the mean token loss of the micro-batch as an f32 scalar,
//    whatever the parameter dtype.
//  * Block boundaries: block_layers() lists the global indices of the blocks
//    a stage holds — the units activation recompute wraps (the model applies
//    the recompute policy it was built with at those boundaries) and that
//    ZeRO-3 gathers (StageParameter::block, set_block_hooks).
//  * Errors: validate() throws InvalidArgument before any communication when
//    the model cannot be laid out so; build_stage() does not communicate.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "torus/comm/process_group.h"
#include "torus/parallel/block_hooks.h"
#include "torus/parallel/expert/routing_stats.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/sharding.h"

namespace torch::nn {
class Module;
}

namespace torus::engine {

struct StageParameter {
  std::string name;  // global (single-process) name
  at::Tensor tensor;  // this rank's shard
  tp::ShardSpec spec;
  // Non-empty: one of the copies of a parameter that several stages hold
  // (a tied word embedding on the first and the last stage), all with this
  // key; their gradients add. One key per model at most.
  std::string tie_key;
  bool tie_copy = false;     // a copy that is not the owner: clipping does not count it
  // A copy: the global name of the parameter it copies (checkpoints save the
  // owner once and load the copy from it).
  std::string tied_to;
  bool weight_decay = true;  // matrices and embeddings decay; gains and biases do not
  // The global index of the block (block_layers()) the parameter belongs to;
  // -1 for parameters outside blocks (embeddings, final norm, head). ZeRO-3
  // gathers parameters block by block.
  int64_t block = -1;
  // An expert's parameter (Note [MoE groups] in parallel/expert/moe.h): held
  // by one ep rank of each dp x tp coordinate, reduced over the ranks that
  // hold the same expert; its global name carries the global expert index.
  bool expert = false;
};

class StageModule {
 public:
  virtual ~StageModule() = default;
  // The module that owns the stage's parameters (train()/eval(), hooks).
  virtual std::shared_ptr<torch::nn::Module> module() const = 0;
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  // Last stage: mean token loss against labels [b, s], an f32 scalar.
  virtual at::Tensor loss(const at::Tensor& output, const at::Tensor& labels) = 0;
  virtual std::vector<StageParameter> parameters() const = 0;
  // Full (TP-gathered, unpadded) values of the stage's parameters by global
  // name. Collective over `tp` (null: one rank).
  virtual std::map<std::string, at::Tensor> gather_full_parameters(const comm::ProcessGroupPtr& tp) const = 0;
  virtual std::vector<int64_t> block_layers() const = 0;
  // Installs hooks around every block's forward (parallel/block_hooks.h);
  // returns false when the model does not support them (then ZeRO-3 keeps
  // the whole stage gathered). Null removes them.
  virtual bool set_block_hooks(std::shared_ptr<parallel::BlockHooks> hooks) = 0;
  // The stage's dropout streams (random.h RngTracker), by stream name
  // ("replicated", "sharded": the latter differs per TP rank), and setting
  // them back (state_dict / load_state_dict of the engine).
  virtual std::map<std::string, at::Tensor> rng_state() const = 0;
  virtual void set_rng_state(const std::map<std::string, at::Tensor>& state) = 0;
  // Mixture of experts (parallel/expert/moe.h); the defaults fit a dense
  // model. The gradient scale of the auxiliary losses (the engine's
  // 1/num_micro x loss scale), set before each step's pipeline.
  virtual void set_loss_grad_scale(double /*scale*/) {}
  // After each step: the routing statistics of the stage's MoE layers since
  // the last call, and the auxiliary-loss-free bias update (`stepped`: the
  // optimizer step was taken). Not collective.
  virtual std::vector<ep::LayerRoutingStats> end_step(bool /*stepped*/) { return {}; }
  // State that is not a parameter and is the same on every rank that holds
  // it (router biases), by global name; aliases the live tensors.
  virtual std::map<std::string, at::Tensor> extra_state() const { return {}; }
  // Last stage: the full logits [b, s, vocab] of `output` (what forward
  // returned: for the decoders [s, b, padded_vocab/tp]), gathered over `tp`
  // and without the vocabulary padding. Collective over `tp`. The default
  // throws Unsupported.
  virtual at::Tensor full_logits(const at::Tensor& output, const comm::ProcessGroupPtr& tp);
};

struct ModelLayout {
  int tp = 1;
  bool sequence_parallel = false;
  int num_stages = 1;
  std::vector<int64_t> blocks_per_stage;  // empty: the model balances the cut
  int ep = 1;  // expert-parallel size (MoE models)
};

// What the memory pre-check (memory_plan.h) needs from the model about one
// pipeline rank: its parameters (this TP rank's shards) by where they lie,
// and the activations of ONE micro-batch through all of the rank's chunks at
// 16-bit (the estimator scales by the dtype and the micro-batches alive).
struct RankMemoryShape {
  int64_t blocks = 0;           // blocks on the rank
  int64_t block_params = 0;     // Ψ_b: their parameters
  int64_t largest_block = 0;    // parameters of the largest block (a ZeRO-3 unit)
  int64_t outside_params = 0;   // Ψ_o: embeddings, final norm, head
  double activations_16 = 0;    // bytes of one micro-batch's activations kept for backward
  double recompute_extra_16 = 0;  // one block's activations while it is recomputed (0: no recompute)
  double head_bytes = 0;        // per micro-batch, beside the 16-bit ones (e.g. f32 logits and their gradient)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;
  // Throws InvalidArgument when the model cannot be laid out so. Pure.
  virtual void validate(const ModelLayout& layout) const = 0;
  // Throws InvalidArgument unless a batch of `seq_len` tokens fits.
  virtual void validate_sequence(int64_t seq_len, const ModelLayout& layout) const = 0;
  // What each of layout.num_stages stages holds ("embedding + blocks 0-1").
  virtual std::vector<std::string> describe_stages(const ModelLayout& layout) const = 0;
  // The module of `stage` for this rank, sharded over groups.tp. The model's
  // dropout streams are per stage (random.h: RngTracker's stage).
  virtual std::unique_ptr<StageModule> build_stage(int stage, const ModelLayout& layout,
                                                   const parallel::ParallelGroups& groups) const = 0;
  virtual int64_t num_parameters() const = 0;
  // Model FLOPs of one token's forward and backward at `seq_len` (the MFU
  // numerator; recompute is not counted).
  virtual double flops_per_token(int64_t seq_len) const = 0;
  // Per pipeline rank (layout.num_stages / num_chunks ranks; stage = chunk x
  // ranks + rank) for micro-batches of `rows` x `seq` tokens. Empty: the
  // model says nothing finer than num_parameters() (the pre-check then
  // assumes an even share and no activations).
  virtual std::vector<RankMemoryShape> memory_shape(const ModelLayout& /*layout*/, int /*num_chunks*/,
                                                    int64_t /*rows*/, int64_t /*seq*/) const {
    return {};
  }
  // MoE models: the number of layers and experts for the routing statistics
  // (RoutingSummary::pack); {0, 0} for a dense model.
  virtual std::pair<int64_t, int64_t> routing_shape() const { return {0, 0}; }
  virtual c10::ScalarType param_dtype() const = 0;
  virtual c10::Device device() const = 0;
  // One line for the run's log: "llama: 16 layers, width 2048, 32 heads (8
  // kv), ffn 8192, vocab 128256".
  virtual std::string describe() const { return name(); }
  // Whether its stages give their logits (StageModule::full_logits): what
  // Trainer::logits asks on every rank before it runs anything.
  virtual bool gives_logits() const { return false; }
  // The model's whole shape as a JSON object (text), with "family" (gpt,
  // llama) and the family's config fields under their config names
  // (vocab_size, num_layers, hidden, ...; every default resolved): what a
  // checkpoint's manifest records, what resuming compares and what an
  // exporter (docs/hf.md) rebuilds the model from.
  virtual std::string config_json() const { return "{}"; }
};

}  // namespace torus::engine
