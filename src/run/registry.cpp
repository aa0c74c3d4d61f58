// Model adapters by name (model.h: make_model): a preset
// (model_presets.h) with the run's shape options over it.
#include <c10/core/ScalarType.h>

#include <algorithm>

#include "core/log.h"
#include "torus/recompute/recompute.h"
#include "torus/engine/gpt_model.h"
#include "torus/engine/hf.h"
#include "torus/engine/llama_model.h"
#include "torus/engine/model.h"
#include "torus/run/model_presets.h"
#include "torus/run/registry.h"

namespace torus::run {

using namespace engine;  // the engine this layer drives  // NOLINT
namespace {

// A shape option given (non-zero) wins over the preset's value.
template <class T>
T pick(T option, T preset) {
  return option != T{} ? option : preset;
}

c10::ScalarType param_dtype(const RunConfig& c) {
  return c.precision == "f64"    ? at::kDouble
         : c.precision == "bf16" ? at::kBFloat16
         : c.precision == "fp16" ? at::kHalf
                                 : at::kFloat;
}

std::shared_ptr<Model> make_gpt(const RunConfig& c, const ModelPreset& p) {
  TORUS_CHECK(c.kv_heads == 0 && c.rope_theta == 0, InvalidArgument,
              "--model {}: --kv-heads and --rope-theta are Llama options (the GPT has multi-head attention and a "
              "learned position table)",
              c.model);
  models::GPTConfig g;
  g.vocab_size = pick(c.vocab, p.vocab);
  g.max_seq_len = std::max(p.context, c.seq);
  g.num_layers = pick(c.layers, p.layers);
  g.hidden = pick(c.hidden, p.hidden);
  g.num_heads = pick(c.heads, p.heads);
  g.ffn_hidden = pick(c.ffn, p.ffn);
  g.dropout = c.dropout;
  g.attention_dropout = c.dropout;
  g.tie_embeddings = c.tie_embeddings;
  g.seed = static_cast<uint64_t>(c.seed);
  g.recompute = recompute::Policy::parse(c.layout.recompute);
  g.moe_every = c.moe_every;
  g.moe.num_experts = c.experts;
  g.moe.top_k = c.top_k;
  g.moe.capacity_factor = c.capacity_factor;
  g.moe.aux_loss_weight = c.aux_loss_weight >= 0 ? c.aux_loss_weight : (c.aux_loss_free ? 0.0 : 1e-2);
  g.moe.z_loss_weight = c.z_loss_weight;
  g.moe.aux_loss_free = c.aux_loss_free;
  g.moe.bias_update_rate = c.bias_update_rate;
  g.moe.jitter = c.moe_jitter;
  g.moe.ffn_hidden = c.moe_ffn;
  g.moe.expert_tensor_parallel = c.layout.expert_tp;
  g.dtype = param_dtype(c);
  return std::make_shared<GPTModel>(g);
}

std::shared_ptr<Model> make_llama(const RunConfig& c, const ModelPreset& p) {
  TORUS_CHECK(c.moe_every == 0, InvalidArgument, "--model {}: MoE blocks (--moe-every) are built for the GPT only",
              c.model);
  TORUS_CHECK(c.dropout == 0, InvalidArgument, "--model {}: the Llama has no dropout (--dropout {})", c.model,
              c.dropout);
  models::LlamaConfig l;
  l.vocab_size = pick(c.vocab, p.vocab);
  l.max_seq_len = std::max(p.context, c.seq);
  l.num_layers = pick(c.layers, p.layers);
  l.hidden = pick(c.hidden, p.hidden);
  l.num_heads = pick(c.heads, p.heads);
  // A width or head count given without --kv-heads keeps multi-head attention
  // unless the preset's kv heads still divide the heads.
  const int64_t kv = pick(c.kv_heads, p.kv_heads);
  l.num_kv_heads = kv > 0 && l.num_heads % kv == 0 ? kv : (c.kv_heads > 0 ? c.kv_heads : 0);
  // The preset's head_dim holds only with the preset's width and heads.
  l.head_dim = (c.hidden == 0 && c.heads == 0) ? p.head_dim : 0;
  l.ffn_hidden = pick(c.ffn, p.ffn);
  l.rope_theta = pick(c.rope_theta, p.rope_theta);
  if (p.rope_scaling == "llama3") l.rope_scaling = {"llama3", 32.0, 1.0, 4.0, 8192};
  l.tie_embeddings = c.tie_embeddings;
  l.seed = static_cast<uint64_t>(c.seed);
  l.recompute = recompute::Policy::parse(c.layout.recompute);
  l.dtype = param_dtype(c);
  return std::make_shared<LlamaModel>(l);
}

// --model DIR: the shape of a Hugging Face directory's config.json; the
// run's options give only what config.json does not hold (precision, seed,
// recompute, dropout), so a shape option would contradict the file.
std::shared_ptr<Model> make_hf(const RunConfig& c) {
  TORUS_CHECK(c.layers == 0 && c.hidden == 0 && c.heads == 0 && c.kv_heads == 0 && c.ffn == 0 && c.vocab == 0 &&
                  c.rope_theta == 0,
              InvalidArgument,
              "--model {}: the shape comes from {}/config.json; drop --layers, --hidden, --heads, --kv-heads, --ffn, "
              "--vocab and --rope-theta",
              c.model, c.model);
  TORUS_CHECK(c.moe_every == 0, InvalidArgument, "--model {}: a Hugging Face model has no Torus MoE blocks (--moe-every)",
              c.model);
  HfConfig hf = read_hf_config(c.model);
  if (hf.family == HfFamily::kGPT2) {
    models::GPTConfig g = hf.gpt;
    TORUS_CHECK(c.seq <= g.max_seq_len, InvalidArgument,
                "--model {}: --seq {} is longer than the model's position table (n_positions {})", c.model, c.seq,
                g.max_seq_len);
    g.dropout = c.dropout;
    g.attention_dropout = c.dropout;
    g.seed = static_cast<uint64_t>(c.seed);
    g.recompute = recompute::Policy::parse(c.layout.recompute);
    g.dtype = param_dtype(c);
    return std::make_shared<GPTModel>(g);
  }
  TORUS_CHECK(c.dropout == 0, InvalidArgument, "--model {}: the Llama has no dropout (--dropout {})", c.model,
              c.dropout);
  models::LlamaConfig l = hf.llama;
  l.max_seq_len = std::max(l.max_seq_len, c.seq);
  l.seed = static_cast<uint64_t>(c.seed);
  l.recompute = recompute::Policy::parse(c.layout.recompute);
  l.dtype = param_dtype(c);
  return std::make_shared<LlamaModel>(l);
}

}  // namespace

std::shared_ptr<Model> make_model(const RunConfig& c) {
  c.validate();
  if (find_model_preset(c.model) == nullptr && is_hf_model_dir(c.model)) return make_hf(c);
  const ModelPreset* p = find_model_preset(c.model);
  TORUS_CHECK(p != nullptr, InvalidArgument, "--model: unknown model '{}' (known: {})", c.model,
              model_preset_names());
  return p->family == "llama" ? make_llama(c, *p) : make_gpt(c, *p);
}

}  // namespace torus::run
