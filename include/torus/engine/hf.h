// torus/engine/hf.h — Hugging Face weights in and out, for the GPT-2 and Llama
// families (docs/hf.md).
//
//   auto hf = torus::engine::read_hf_config("gpt2-dir");      // config.json -> a GPTConfig or LlamaConfig
//   torus::engine::GPTTrainer trainer(world, hf.gpt, layout);  // (with the run's layout, dtype, ...)
//   torus::engine::load_hf_weights(trainer, "gpt2-dir");       // every rank its slices, from a memory map
//   ...
//   auto ck = torus::ckpt::Checkpoint::open("runs/a/checkpoints/step-00000500");
//   torus::engine::export_hf(ck, torus::engine::hf_config_of_checkpoint(ck), "out-dir");  // from_pretrained("out-dir")
//
// Note [HF mapping]: Torus's global parameter names and layouts against
// Hugging Face's (names may carry HF's "transformer." (GPT-2) or "model."
// (Llama) prefix, or not):
//   GPT-2 (Conv1D weights are [in, out]: transposed both ways)
//     embedding.word.weight [V, h]   wte.weight
//     embedding.position [S, h]      wpe.weight [n_positions, h]: its first S rows (S <= n_positions)
//     blocks.i.ln1.*, ln2.*          h.i.ln_1.*, h.i.ln_2.*
//     blocks.i.qkv.weight [3h, h]    h.i.attn.c_attn.weight [h, 3h]: Torus row (head, j, d) (Note [QKV
//                                    layout] in models/gpt.h) is HF column j h + head hd + d, j = q, k, v
//     blocks.i.qv_bias [H, 2, hd]    h.i.attn.c_attn.bias [3h]: the q and v parts; HF's key bias is
//                                    dropped (softmax ignores it exactly) and exported as zeros
//     blocks.i.proj.*                h.i.attn.c_proj.* (weight transposed)
//     blocks.i.fc1.*, fc2.*          h.i.mlp.c_fc.*, h.i.mlp.c_proj.* (weights transposed)
//     head.ln_f.*                    ln_f.*
//     head.output [V, h]             lm_head.weight (untied); tied: lm_head absent or equal to wte
//     (HF's attn.bias / attn.masked_bias mask buffers are ignored)
//   Llama: the 1:1 renames of models/llama.h's header; no permutation.
// Reading: only the slices a rank holds are copied out of the map (the QKV
// re-layout gathers the rows of the slice), converted to the model's dtype
// on the copy (Note [Weight sources] in checkpointing.h).
//
// Errors: a config.json outside what the families here compute (another
// activation, attention or MLP biases in Llama, a RoPE scaling other than
// linear or llama3, ...) is refused with InvalidArgument naming the field; a
// weight that is missing or of the wrong shape is a CheckpointError naming
// the Hugging Face tensor and the Torus parameter. Tensors of the directory
// that the mapping does not use are logged as a warning (rank 0). Nothing
// here communicates.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "torus/checkpoint/checkpoint.h"
#include "torus/models/gpt.h"
#include "torus/models/llama.h"
#include "torus/engine/checkpointing.h"
#include "torus/engine/trainer.h"

namespace torus::engine {

enum class HfFamily { kGPT2, kLlama };
// "gpt2" | "llama" (config.json's model_type).
std::string hf_model_type(HfFamily family);

// A Hugging Face model configuration as a Torus model's.
struct HfConfig {
  HfFamily family = HfFamily::kGPT2;
  models::GPTConfig gpt;      // family kGPT2: sizes, layernorm_eps, tie_embeddings (the rest: defaults)
  models::LlamaConfig llama;  // family kLlama: sizes, rms_eps, rope, tie_embeddings
  std::string dtype;          // config.json's torch_dtype (or dtype): "float32", "bfloat16", ...; "" if absent

  int64_t vocab_size() const { return family == HfFamily::kGPT2 ? gpt.vocab_size : llama.vocab_size; }
  int64_t num_layers() const { return family == HfFamily::kGPT2 ? gpt.num_layers : llama.num_layers; }
  bool tie_embeddings() const { return family == HfFamily::kGPT2 ? gpt.tie_embeddings : llama.tie_embeddings; }
};

// Parses config.json text (`what` names it in messages). GPT-2: n_embd,
// n_layer, n_head, n_positions, vocab_size, n_inner (null: 4h),
// layer_norm_epsilon, activation_function (gelu_new | gelu_pytorch_tanh),
// tie_word_embeddings (default true). Llama: hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
// intermediate_size, rms_norm_eps, max_position_embeddings,
// tie_word_embeddings, rope_theta + rope_scaling (transformers 4) or
// rope_parameters (transformers 5), hidden_act silu, no attention or MLP
// bias. InvalidArgument naming the field for anything else.
HfConfig parse_hf_config(const std::string& json_text, const std::string& what);
// <dir>/config.json; CheckpointError when it cannot be read.
HfConfig read_hf_config(const std::string& dir);
// The config.json that from_pretrained needs for `config` (architectures,
// model_type, sizes, torch_dtype of `dtype`, tie_word_embeddings), as text.
std::string hf_config_json(const HfConfig& config, c10::ScalarType dtype);

// The weights of a Hugging Face directory (model.safetensors or the index)
// as a WeightSource of Torus's global names (Note [HF mapping]), for a
// model with `max_seq_len` positions (GPT-2: <= n_positions; -1: all).
// Opens and validates the files and, for a tied config with an lm_head,
// checks it equals the word embedding. CheckpointError on a bad directory.
std::unique_ptr<WeightSource> hf_weight_source(const std::string& dir, const HfConfig& config,
                                               int64_t max_seq_len = -1);
// The directory's tensors the mapping does not use (mask buffers aside).
std::vector<std::string> hf_unused_tensors(const std::string& dir, const HfConfig& config);

// Loads a Hugging Face directory into `trainer` (config.json, then the
// weights through hf_weight_source and load_weights): every rank its slices.
// The trainer's model must be of the family, with the same heads (and, for
// GPT-2, max_seq_len <= n_positions; a Torus model tied where the HF one is
// not is refused, the other way round the output layer starts from the
// embedding): InvalidArgument otherwise. Not collective.
void load_hf_weights(Trainer& trainer, const std::string& dir);

// The inverse mapping: Hugging Face tensors (names as save_pretrained writes
// them: "transformer." for GPT-2, "model." for Llama; lm_head only when
// untied) of full, unpadded Torus tensors by bare global name. Contiguous
// copies. CheckpointError naming the Torus tensor that is missing or of
// another shape than `config` says.
std::map<std::string, at::Tensor> to_hf_tensors(const HfConfig& config,
                                                const std::map<std::string, at::Tensor>& torus);

// A checkpoint's model as a Hugging Face config: the family from the
// manifest's model JSON ("model": "gpt" | "llama"), the heads from its
// "heads", every size from the saved tensors' shapes (vocabulary, positions,
// width, layers, ffn, kv heads; tied when no head.output was saved), the
// rest from the options JSON when it has them (Llama: rms_eps, rope_theta,
// rope scaling) else the defaults. InvalidArgument when the manifest does not
// describe a model that exports (MoE blocks, another model).
HfConfig hf_config_of_checkpoint(const ckpt::Checkpoint& ckpt);

struct HfExportOptions {
  std::optional<c10::ScalarType> dtype;  // the tensors' dtype in the files; unset: as saved
  // Largest shard in bytes (Hugging Face's default, 5 GB); a model larger
  // than this is written as model-0000K-of-0000N.safetensors with a
  // model.safetensors.index.json. 0: always one model.safetensors.
  int64_t max_shard_bytes = 5'000'000'000;
  // Tokenizer files to copy beside the weights (hf_tokenizer_files: the
  // ones that exist). Empty: the run's --init-from directory when the
  // manifest names one that has them, else none. "-": none.
  std::string tokenizer_dir;
};

// The tokenizer (and generation) files of a Hugging Face directory that
// exist: tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// tokenizer.model, vocab.json, merges.txt, added_tokens.json,
// generation_config.json, chat_template.jinja, chat_template.json. Their
// names.
std::vector<std::string> hf_tokenizer_files(const std::string& dir);

// What export_hf wrote.
struct HfExportReport {
  std::vector<std::string> weight_files;  // model.safetensors or the shards, in order
  std::vector<std::string> tokenizer_files;
  std::string tokenizer_dir;              // where they came from ("" when none)
  int64_t total_bytes = 0;                // tensor bytes in the weight files
};

// Writes <out_dir>/config.json and the weights — model.safetensors, or the
// shards and their index when the model is larger than
// options.max_shard_bytes — each atomically (temporary name, fsync,
// rename; an earlier config.json is removed first, the new one written
// last, so a directory with a config.json holds a whole export), reading every model tensor of
// `ckpt` with read_full (any layout) and applying to_hf_tensors; copies the
// tokenizer files (HfExportOptions::tokenizer_dir). Weight files of the
// other form left by an earlier export are removed, so from_pretrained
// reads only these. Creates out_dir. CheckpointError on a tensor the
// checkpoint lacks or I/O failure; InvalidArgument when an explicit
// tokenizer_dir has no tokenizer file.
HfExportReport export_hf(const ckpt::Checkpoint& ckpt, const HfConfig& config, const std::string& out_dir,
                         const HfExportOptions& options = {});

}  // namespace torus::engine
