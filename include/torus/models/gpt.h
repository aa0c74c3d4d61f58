// torus/models/gpt.h — the reference GPT: a pre-LayerNorm decoder built from
// the tensor-parallel layers. It is the model of the correctness tests, the
// benchmarks and the training CLI.
//
//   tokens [b, s] -> GPTEmbedding (vocab-parallel word + learned positions)
//                 -> hidden [s, b, h]          (sequence-first, Note [TP layouts])
//                 -> GPTBlock x L: x + attn(ln1(x)); x + mlp(ln2(x))
//                 -> GPTHead: ln_f, output projection (tied or untied)
//                 -> logits [s, b, padded_vocab/tp] -> vocab-parallel cross entropy
//
// Tensor parallelism splits attention heads (fused QKV, column parallel;
// output projection, row parallel), the MLP (fc1 column, fc2 row) and the
// vocabulary (embedding and output layer). With sequence parallelism the
// hidden states between blocks are [s/tp, b, h], and LayerNorm, dropout and
// the residual adds work on the local slice of the sequence.
//
// Note [QKV layout]: the fused QKV weight [3h, h] stores its rows head by
// head, [num_heads][q|k|v][head_dim], so that a contiguous TP slice holds
// whole heads, each with its q, k and v. Only queries and values have a bias
// ("qv_bias", [num_heads, 2, head_dim]): a key bias adds the same q.b to every
// score of a query's row, which softmax ignores, so its gradient is exactly
// zero and an Adam step would only integrate rounding noise into it (Whisper
// omits it for the same reason).
//
// Layout independence: every parameter is initialised from
// derive_seed(config.seed, <its name>) (Note [Layout-independent init]), so
// any TP size — and any pipeline cut (GPTPart) — holds slices of the same
// model. Dropout follows Note [Dropout RNG rule] (random.h); the correctness
// contract is stated for dropout 0.
//
// Pipeline cuts: a GPT built with a GPTPart holds only its embedding, a
// contiguous range of blocks, and/or its head; forward() takes tokens when the
// part has the embedding, else hidden states, and returns logits when it has
// the head, else hidden states. With tied embeddings, a part that has the head
// but not the embedding owns a copy of the word embedding ("head.output.weight",
// same initial value); the pipeline must add the two copies' gradients.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "torus/parallel/block_hooks.h"
#include "torus/parallel/expert/moe.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/layers.h"
#include "torus/parallel/tensor/random.h"
#include "torus/recompute/recompute.h"

namespace torus::models {

struct GPTConfig {
  int64_t vocab_size = 50257;
  int64_t max_seq_len = 1024;  // rows of the position table; inputs may be shorter
  int64_t num_layers = 12;
  int64_t hidden = 768;
  int64_t num_heads = 12;
  int64_t ffn_hidden = 0;  // 0: 4 * hidden
  double dropout = 0.0;    // embedding and residual dropout
  double attention_dropout = 0.0;
  double layernorm_eps = 1e-5;
  bool tie_embeddings = true;
  bool sequence_parallel = false;
  int64_t vocab_pad_multiple = 1;  // padded vocab: multiple of vocab_pad_multiple * tp
  double init_std = 0.02;          // residual projections: init_std / sqrt(2 * num_layers)
  uint64_t seed = 1234;
  // Parameters and activations (bf16/f16: docs/precision.md; the initial
  // values are drawn in fp32 and rounded, so a bf16 model is the fp32 model
  // rounded). LayerNorm, attention softmax and the loss compute in fp32.
  c10::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  // Activations recomputed in backward (docs/recompute.md): full and every:K
  // wrap whole blocks (by global layer index), selective each block's
  // attention core. Only when gradients are recorded; results are the same.
  recompute::Policy recompute;
  // Mixture of experts (parallel/expert/moe.h): with moe_every = K > 0,
  // blocks K-1, 2K-1, ... have an MoE MLP instead of the dense one. The
  // layer's sizes, seed, dtype and device are the GPT's (moe.hidden,
  // ffn_hidden (0: ffn()), seed, init stds are filled in by the block);
  // moe.num_experts, top_k, capacity_factor, the loss weights and the
  // balancing options are read from here.
  int64_t moe_every = 0;
  ep::MoEConfig moe;

  int64_t ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * hidden; }
  int64_t head_dim() const { return hidden / num_heads; }
  bool is_moe_block(int64_t layer) const { return moe_every > 0 && (layer + 1) % moe_every == 0; }
  int64_t num_moe_blocks() const { return moe_every > 0 ? num_layers / moe_every : 0; }
  // The MoE layer config of block `layer` (sizes and seeds from this config).
  ep::MoEConfig moe_config() const;

  // Throws InvalidArgument naming the problem: sizes < 1, hidden not
  // divisible by num_heads, num_heads or ffn not divisible by tp_size,
  // dropout outside [0, 1), a malformed recompute policy. Pure: no
  // communication.
  void validate(int tp_size) const;
  // Throws InvalidArgument unless an input of `seq_len` fits: seq_len <=
  // max_seq_len and, under sequence parallelism (or with MoE blocks, whose
  // tokens are split over TP), divisible by tp_size.
  void validate_sequence(int64_t seq_len, int tp_size) const;

  // Presets sized for CPUs.
  static GPTConfig tiny();   // 2 layers, width 32, 4 heads, seq 16, vocab 61 (tests)
  static GPTConfig small();  // 4 layers, width 256, 8 heads, seq 128, vocab 8192 (benchmarks)
  static GPTConfig gpt2();   // GPT-2 124M
};

// Which pieces of a decoder this instance holds (pipeline cuts); the GPT's
// and the Llama's (llama.h).
struct DecoderPart {
  bool embedding = true;
  int64_t first_layer = 0;
  int64_t num_layers = -1;  // -1: through the last layer
  bool head = true;
  // The pipeline stage this part is (its dropout streams: RngTracker's stage).
  int stage = 0;
};
using GPTPart = DecoderPart;

// ---- pipeline cuts -------------------------------------------------------------------
//
// The model as a sequence of items for pp::partition_balanced: item 0 is the
// embedding, items 1..L the blocks, item L+1 the head. Costs are forward
// FLOPs per token (the backward scales them alike): a block 24 h^2 + 4 s h
// (QKV, projection, MLP; attention scores and values), the head 2 h V plus
// the cross entropy, the embedding a lookup (h).
std::vector<double> gpt_item_costs(const GPTConfig& config, int64_t seq_len);

// The parts of `num_stages` pipeline stages: the embedding on stage 0, the
// head on the last, blocks in order. `layers_per_stage` (one entry per stage,
// each >= 0, summing to num_layers) fixes the block counts, uneven splits
// allowed; empty: balanced by gpt_item_costs() (a stage may then hold only the
// embedding or only the head). Throws InvalidArgument before any
// communication when the model cannot be cut that way (fewer items than
// stages, counts that do not sum to num_layers, an empty middle stage).
std::vector<GPTPart> gpt_stage_parts(const GPTConfig& config, int num_stages, int64_t seq_len,
                                     const std::vector<int64_t>& layers_per_stage = {});

// The cut of any decoder given its item costs (embedding, L blocks, head:
// L + 2 entries), by the rules of gpt_stage_parts; `what` names the model in
// messages ("GPT", "Llama").
std::vector<DecoderPart> decoder_stage_parts(const std::vector<double>& item_costs, int num_stages,
                                             const std::vector<int64_t>& layers_per_stage, const char* what);

// "embedding + blocks 0-2", "blocks 3-5 + head".
std::string describe_part(const GPTPart& part, int64_t num_layers);

// The mean token loss of vocab-parallel logits [s, b, V/tp] against labels
// [b, s] (ignore_index -100), in fp32 (f64 for f64 logits) whatever the
// logits' dtype (Note [Cross entropy in fp32]). The heads of both decoders.
at::Tensor mean_token_loss(const at::Tensor& logits, const at::Tensor& labels, const comm::ProcessGroupPtr& tp,
                           int64_t vocab_size);

class GPTEmbedding : public torch::nn::Module, public tp::ShardedModule {
 public:
  GPTEmbedding(const GPTConfig& config, const parallel::ParallelGroups& groups, std::shared_ptr<tp::RngTracker> rng);
  // tokens [b, s] int64 -> hidden [s, b, h] ([s/tp, b, h] with sequence parallelism).
  at::Tensor forward(const at::Tensor& tokens);
  tp::ShardSpecs shard_specs() const override;  // position table: partial grads under SP
  const std::shared_ptr<tp::VocabParallelEmbedding>& word() const { return word_; }
  const at::Tensor& position() const { return position_; }

 private:
  GPTConfig config_;
  comm::ProcessGroupPtr tp_;
  std::shared_ptr<tp::RngTracker> rng_;
  std::shared_ptr<tp::VocabParallelEmbedding> word_;
  at::Tensor position_;
};

class GPTBlock : public torch::nn::Module, public tp::ShardedModule {
 public:
  // `layer`: the global layer index (names the parameters' seeds).
  GPTBlock(const GPTConfig& config, int64_t layer, const parallel::ParallelGroups& groups,
           std::shared_ptr<tp::RngTracker> rng);
  // hidden [s, b, h] ([s/tp, b, h] with sequence parallelism), same shape out.
  at::Tensor forward(const at::Tensor& hidden);
  tp::ShardSpecs shard_specs() const override;  // qv_bias: split by heads
  const std::shared_ptr<ep::MoELayer>& moe() const { return moe_; }  // null: a dense MLP

 private:
  at::Tensor attention(const at::Tensor& x);
  // softmax(q k^T / sqrt(d) + causal mask), attention dropout, times v:
  // q, k, v [b, local heads, s, head_dim] -> [b, local heads, s, head_dim].
  // Selective recompute replays exactly this (it holds `this`: the block
  // must outlive the backward of its forwards).
  at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

  GPTConfig config_;
  comm::ProcessGroupPtr tp_;
  std::shared_ptr<tp::RngTracker> rng_;
  int64_t local_heads_ = 0;
  std::shared_ptr<tp::LayerNorm> ln1_, ln2_;
  std::shared_ptr<tp::ColumnParallelLinear> qkv_, fc1_;
  std::shared_ptr<tp::RowParallelLinear> proj_, fc2_;
  std::shared_ptr<ep::MoELayer> moe_;
  at::Tensor qv_bias_;  // [local heads, 2, head_dim]
};

class GPTHead : public torch::nn::Module, public tp::ShardedModule {
 public:
  // `tied_weight`: the word embedding to reuse as the output layer; undefined
  // for an untied head or a pipeline part without the embedding.
  GPTHead(const GPTConfig& config, const parallel::ParallelGroups& groups, const at::Tensor& tied_weight);
  // hidden [s(/tp), b, h] -> logits [s, b, padded_vocab/tp].
  at::Tensor forward(const at::Tensor& hidden);
  // Mean cross entropy over the tokens of logits [s, b, V/tp] against labels
  // [b, s] (ignore_index -100). No logit gather. fp32 (f64 for an f64
  // model) whatever the parameter dtype: bf16/f16 logits are upcast inside
  // the cross entropy.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) const;
  tp::ShardSpecs shard_specs() const override;
  const at::Tensor& output_weight() const { return output_; }

 private:
  GPTConfig config_;
  comm::ProcessGroupPtr tp_;
  bool owns_output_ = false;
  std::shared_ptr<tp::LayerNorm> ln_f_;
  at::Tensor output_;  // [padded_vocab/tp, h]
};

class GPT : public torch::nn::Module {
 public:
  // Validates the config against the TP size (InvalidArgument) before any
  // communication; construction itself communicates nothing.
  GPT(const GPTConfig& config, const parallel::ParallelGroups& groups = {}, const GPTPart& part = {});

  // tokens [b, s] (or hidden states for a part without the embedding) ->
  // logits [s, b, padded_vocab/tp] (or hidden states without the head).
  at::Tensor forward(const at::Tensor& input);
  // forward + mean cross entropy against labels [b, s], in fp32 for bf16/f16
  // models (GPTHead::loss). Needs the head.
  at::Tensor loss(const at::Tensor& input, const at::Tensor& labels);
  // The loss of logits this model's forward returned (GPTHead::loss). Needs the head.
  at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& labels) const;

  const GPTConfig& config() const { return config_; }
  const parallel::ParallelGroups& groups() const { return groups_; }
  const std::shared_ptr<tp::RngTracker>& rng() const { return rng_; }
  const std::shared_ptr<GPTEmbedding>& embedding() const { return embedding_; }  // null if not in part
  const std::vector<std::shared_ptr<GPTBlock>>& blocks() const { return blocks_; }
  const std::shared_ptr<GPTHead>& head() const { return head_; }  // null if not in part
  int64_t padded_vocab() const { return padded_vocab_; }
  // Hooks around every block's forward (parallel/block_hooks.h: ZeRO-3
  // gathers a block's parameters there); null: none.
  void set_block_hooks(std::shared_ptr<parallel::BlockHooks> hooks) { block_hooks_ = std::move(hooks); }

 private:
  GPTConfig config_;
  parallel::ParallelGroups groups_;
  GPTPart part_;
  int64_t padded_vocab_ = 0;
  std::shared_ptr<tp::RngTracker> rng_;
  std::shared_ptr<GPTEmbedding> embedding_;
  std::vector<std::shared_ptr<GPTBlock>> blocks_;
  std::shared_ptr<GPTHead> head_;
  std::shared_ptr<parallel::BlockHooks> block_hooks_;
};

}  // namespace torus::models
