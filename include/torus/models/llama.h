// torus/models/llama.h — the Llama-family decoder: pre-RMSNorm blocks with
// rotary position embeddings, grouped-query attention and a SwiGLU MLP, no
// biases, built from the tensor-parallel layers. The second implementation
// of the model seam (engine/llama_model.h), beside the reference GPT.
//
//   tokens [b, s] -> LlamaEmbedding (vocab-parallel word embedding; no position table)
//                 -> hidden [s, b, h]               (sequence-first, Note [TP layouts])
//                 -> LlamaBlock x L: x + attn(rms1(x)); x + mlp(rms2(x))
//                 -> LlamaHead: final RMSNorm, output projection (tied or untied)
//                 -> logits [s, b, padded_vocab/tp] -> vocab-parallel cross entropy
//
// attn(x) = o(softmax(rope(q(x)) rope(k(x))^T / sqrt(d) + causal) v(x));
// mlp(x) = down(silu(gate(x)) * up(x)).
//
// Global parameter names (single process; Hugging Face's in brackets, the
// layouts are the same — [out, in] weights, rotate-half rotary order):
//   embedding.word.weight      [V, h]          (model.embed_tokens.weight)
//   blocks.i.attn_norm.weight  [h]             (model.layers.i.input_layernorm.weight)
//   blocks.i.q.weight          [H d, h]        (model.layers.i.self_attn.q_proj.weight)
//   blocks.i.k.weight          [K d, h]        (... self_attn.k_proj.weight)
//   blocks.i.v.weight          [K d, h]        (... self_attn.v_proj.weight)
//   blocks.i.o.weight          [h, H d]        (... self_attn.o_proj.weight)
//   blocks.i.mlp_norm.weight   [h]             (model.layers.i.post_attention_layernorm.weight)
//   blocks.i.gate.weight       [f, h]          (... mlp.gate_proj.weight)
//   blocks.i.up.weight         [f, h]          (... mlp.up_proj.weight)
//   blocks.i.down.weight       [h, f]          (... mlp.down_proj.weight)
//   head.norm.weight           [h]             (model.norm.weight)
//   head.output                [V, h]          (lm_head.weight; untied, or the
//                                                last stage's copy of a tied embedding)
// H = num_heads, K = num_kv_heads, d = head_dim.
//
// Note [GQA under TP]: query heads are split over TP (q column parallel, o
// row parallel). When tp divides K, the key/value heads are split too: rank
// r holds kv heads [r K/tp, (r+1) K/tp), exactly the ones its query heads
// read (query head j reads kv head j / (H/K)). Otherwise every rank holds
// all K kv heads (k and v replicated, ShardSpec tp_partial_grad): it
// projects all of them and uses those its query heads read, so its
// gradient of k and v is a partial sum that the gradient sync adds over TP.
//
// Note [Rotary embeddings]: positions 0..s-1 of the full sequence (under
// sequence parallelism q and k are computed after the all-gather, so every
// rank rotates the whole sequence). Frequencies inv_freq_i = 1 /
// theta^(2i/d), i < d/2, and the angles pos x inv_freq, all in f32 in the
// order Hugging Face computes them (so imported weights give the same
// logits); cos/sin rounded to the activations' dtype and applied to the
// first and second halves of each head (x1 cos - x2 sin, x2 cos + x1 sin).
// Scaling (RopeScaling): "linear" divides the frequencies by
// `factor`; "llama3" keeps high frequencies, divides low ones by `factor` and
// blends between (low_freq_factor, high_freq_factor, original_max_position),
// as Llama 3.1 does.
//
// Layout independence: every parameter is drawn from derive_seed(seed,
// <its global name>) (Note [Layout-independent init]); any TP size and any
// pipeline cut (DecoderPart) hold slices of the same model.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "torus/models/gpt.h"  // DecoderPart
#include "torus/parallel/block_hooks.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/layers.h"
#include "torus/parallel/tensor/random.h"
#include "torus/recompute/recompute.h"

namespace torus::models {

struct RopeScaling {
  std::string type = "none";  // none | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;                // llama3
  double high_freq_factor = 4.0;               // llama3
  int64_t original_max_position = 8192;        // llama3: the pre-training context
};

struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t max_seq_len = 2048;  // longest input (no position table: a bound for checks and presets)
  int64_t num_layers = 12;
  int64_t hidden = 768;
  int64_t num_heads = 12;
  int64_t num_kv_heads = 0;  // 0: num_heads (multi-head attention)
  int64_t head_dim = 0;      // 0: hidden / num_heads
  int64_t ffn_hidden = 0;    // 0: 8h/3 rounded up to a multiple of 256 (Llama's rule)
  double rms_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_embeddings = false;
  bool sequence_parallel = false;
  int64_t vocab_pad_multiple = 1;
  double init_std = 0.02;  // o and down: init_std / sqrt(2 L)
  uint64_t seed = 1234;
  c10::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  recompute::Policy recompute;

  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int64_t dim_per_head() const { return head_dim > 0 ? head_dim : hidden / num_heads; }
  int64_t ffn() const;
  // Whether key/value heads are split over `tp_size` ranks (Note [GQA under TP]).
  bool kv_split(int tp_size) const { return kv_heads() % tp_size == 0; }

  // Throws InvalidArgument naming the problem: sizes < 1, an odd head
  // dimension, hidden not divisible by num_heads (when head_dim is 0),
  // num_heads not a multiple of num_kv_heads, num_heads or ffn not divisible
  // by tp_size, a bad rope scaling, a malformed recompute policy. Pure.
  void validate(int tp_size) const;
  // seq_len in [1, max_seq_len] and, under sequence parallelism, divisible by tp_size.
  void validate_sequence(int64_t seq_len, int tp_size) const;

  // Presets (docs/models.md).
  static LlamaConfig tiny();   // 2 layers, width 32, 4 heads / 2 kv heads, ffn 64, seq 16, vocab 61 (tests)
  // The published shapes (llama-125m, llama-1b, ...) are the model presets of
  // run/model_presets.h, the one table torus-train and Python read.
};

// The rotary tables of one sequence length: cos and sin [s, d] in f32 (Note
// [Rotary embeddings]). Exposed for tests.
std::pair<at::Tensor, at::Tensor> rotary_tables(const LlamaConfig& config, int64_t seq_len, c10::Device device);
// Rotates x [b, heads, s, d] by the tables (rotate-half order); the result
// has x's dtype.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Pipeline cuts, as gpt_stage_parts (the same rules and errors); item costs
// per token: a block 2 (h H d + 2 h K d + H d h + 3 h f) + 4 s H d, the head
// 2 h V plus the cross entropy, the embedding a lookup.
std::vector<double> llama_item_costs(const LlamaConfig& config, int64_t seq_len);
std::vector<DecoderPart> llama_stage_parts(const LlamaConfig& config, int num_stages, int64_t seq_len,
                                           const std::vector<int64_t>& layers_per_stage = {});

// A key or value projection [K d / tp, h] (split) or [K d, h] (replicated,
// partial gradients over TP): Note [GQA under TP].
class LlamaKV : public torch::nn::Module, public tp::ShardedModule {
 public:
  LlamaKV(int64_t out_features, int64_t in_features, bool split, const tp::InitSpec& init,
          const parallel::ParallelGroups& groups, const at::TensorOptions& options);
  tp::ShardSpecs shard_specs() const override { return {{"weight", spec_}}; }
  const at::Tensor& weight() const { return weight_; }

 private:
  tp::ShardSpec spec_;
  at::Tensor weight_;
};

class LlamaBlock : public torch::nn::Module, public tp::ShardedModule {
 public:
  LlamaBlock(const LlamaConfig& config, int64_t layer, const parallel::ParallelGroups& groups);
  // hidden [s, b, h] ([s/tp, b, h] with sequence parallelism), same shape out.
  at::Tensor forward(const at::Tensor& hidden);
  tp::ShardSpecs shard_specs() const override { return {}; }

 private:
  at::Tensor attention(const at::Tensor& x);

  LlamaConfig config_;
  comm::ProcessGroupPtr tp_;
  int64_t local_heads_ = 0, local_kv_heads_ = 0;
  bool kv_split_ = true;
  at::Tensor kv_index_;  // replicated kv: the kv head of each local query head
  std::shared_ptr<tp::RMSNorm> attn_norm_, mlp_norm_;
  std::shared_ptr<tp::ColumnParallelLinear> q_, gate_, up_;
  std::shared_ptr<tp::RowParallelLinear> o_, down_;
  std::shared_ptr<LlamaKV> k_, v_;
};

class Llama : public torch::nn::Module, public tp::ShardedModule {
 public:
  // Validates against the TP size (InvalidArgument) before any
  // communication; construction communicates nothing.
  Llama(const LlamaConfig& config, const parallel::ParallelGroups& groups = {}, const DecoderPart& part = {});

  // tokens [b, s] (or hidden states for a part without the embedding) ->
  // logits [s, b, padded_vocab/tp] (or hidden states without the head).
  at::Tensor forward(const at::Tensor& input);
  // Mean cross entropy of logits [s, b, V/tp] against labels [b, s]
  // (ignore_index -100), f32 whatever the dtype. Needs the head.
  at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& labels) const;
  at::Tensor loss(const at::Tensor& input, const at::Tensor& labels) { return loss_of(forward(input), labels); }
  // The untied (or copied) output layer's vocabulary rows are TP shards.
  tp::ShardSpecs shard_specs() const override;

  const LlamaConfig& config() const { return config_; }
  const std::shared_ptr<tp::RngTracker>& rng() const { return rng_; }
  const std::vector<std::shared_ptr<LlamaBlock>>& blocks() const { return blocks_; }
  bool has_embedding() const { return word_ != nullptr; }
  bool has_head() const { return head_norm_ != nullptr; }
  int64_t padded_vocab() const { return padded_vocab_; }
  void set_block_hooks(std::shared_ptr<parallel::BlockHooks> hooks) { block_hooks_ = std::move(hooks); }

 private:
  LlamaConfig config_;
  parallel::ParallelGroups groups_;
  DecoderPart part_;
  int64_t padded_vocab_ = 0;
  std::shared_ptr<tp::RngTracker> rng_;  // no dropout; kept for the engine's RNG state
  std::shared_ptr<tp::VocabParallelEmbedding> word_;
  std::vector<std::shared_ptr<LlamaBlock>> blocks_;
  std::shared_ptr<tp::RMSNorm> head_norm_;
  at::Tensor output_;  // [padded_vocab/tp, h]: the embedding's weight when tied on this part
  bool owns_output_ = false;
  std::shared_ptr<parallel::BlockHooks> block_hooks_;
};

}  // namespace torus::models
