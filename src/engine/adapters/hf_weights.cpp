// Hugging Face weights into a Torus model (hf.h, Note [HF mapping]): the
// WeightSource over a memory-mapped HF directory, and load_hf_weights.
#include <ATen/Functions.h>

#include <regex>
#include <set>

#include "core/log.h"
#include "torus/checkpoint/mapped_safetensors.h"
#include "torus/engine/gpt_model.h"
#include "torus/engine/hf.h"
#include "torus/engine/llama_model.h"

namespace torus::engine {
namespace {

using Shape = std::vector<int64_t>;

// "blocks.<i>.<rest>" -> i and rest; -1 otherwise.
int64_t block_of(const std::string& name, std::string* rest) {
  static const std::regex re(R"(blocks\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  *rest = m[2];
  return std::stoll(m[1]);
}

// What one Torus parameter reads: HF tensors with the shapes config.json
// implies, and how they become the Torus tensor.
struct Rule {
  enum class Kind { kSame, kTranspose, kQKV, kQVBias, kRows } kind = Kind::kSame;
  std::string hf;  // the HF tensor (without the directory's prefix)
  Shape hf_shape;
  int64_t rows = -1;  // kRows: the first rows
};

class HfSource : public WeightSource {
 public:
  HfSource(const std::string& dir, const HfConfig& config, int64_t max_seq_len)
      : dir_(ckpt::MappedWeightDir::open(dir)), config_(config) {
    if (config.family == HfFamily::kGPT2) {
      prefix_ = dir_.contains("transformer.wte.weight") ? "transformer." : "";
      max_seq_ = max_seq_len < 0 ? config.gpt.max_seq_len : max_seq_len;
    } else {
      prefix_ = dir_.contains("model.embed_tokens.weight") ? "model." : "";
    }
    if (config.tie_embeddings() && dir_.contains("lm_head.weight")) {
      // A tied model's lm_head, when saved, must be the word embedding.
      const std::string word = config.family == HfFamily::kGPT2 ? "wte.weight" : "embed_tokens.weight";
      const at::Tensor e = checked(word, {config.vocab_size(), hidden()}, "embedding.word.weight");
      const at::Tensor h = checked("lm_head.weight", {config.vocab_size(), hidden()}, "head.output");
      TORUS_CHECK(at::equal(e, h), ckpt::CheckpointError,
                  "{}: config.json ties the embeddings but lm_head.weight differs from {}{}", describe(), prefix_,
                  word);
    }
  }

  std::string describe() const override {
    return fmt::format("Hugging Face {} weights in {}", hf_model_type(config_.family), dir_.dir());
  }

  std::string expected(const std::string& name) const override {
    const std::optional<Rule> r = rule(name);
    if (!r) return "nothing: no Hugging Face tensor maps to it";
    return "'" + full_name(r->hf) + "'";
  }

  std::optional<SourceTensor> find(const std::string& name) const override {
    const std::optional<Rule> r = rule(name);
    if (!r || !dir_.contains(full_name(r->hf))) return std::nullopt;
    const at::Tensor t = checked(r->hf, r->hf_shape, name);
    const std::string origin = "'" + full_name(r->hf) + "'";
    switch (r->kind) {
      case Rule::Kind::kSame: return SourceTensor::of(t, origin);
      case Rule::Kind::kTranspose: return SourceTensor::of(t.t(), origin + " transposed");
      case Rule::Kind::kRows: {
        TORUS_CHECK(r->rows <= t.size(0), InvalidArgument,
                    "{}: the model has {} positions, {} only {} (n_positions)", describe(), r->rows, origin,
                    t.size(0));
        return SourceTensor::of(t.narrow(0, 0, r->rows), fmt::format("{} rows [0, {})", origin, r->rows));
      }
      case Rule::Kind::kQVBias: {
        const int64_t H = config_.gpt.num_heads, hd = config_.gpt.head_dim();
        // [3h] = [q|k|v][head][d] -> [head][q|v][d]; the key bias dropped.
        at::Tensor b = t.view({3, H, hd}).permute({1, 0, 2});
        return SourceTensor::of(at::stack({b.select(1, 0), b.select(1, 2)}, 1), origin + " q and v parts");
      }
      case Rule::Kind::kQKV: return qkv(t, origin);
    }
    return std::nullopt;
  }

  // Every HF tensor the mapping of the whole model reads.
  std::set<std::string> used() const {
    std::set<std::string> out;
    const int64_t L = config_.num_layers();
    std::vector<std::string> names;
    if (config_.family == HfFamily::kGPT2) {
      names = {"embedding.word.weight", "embedding.position", "head.ln_f.weight", "head.ln_f.bias"};
      for (int64_t i = 0; i < L; ++i) {
        for (const char* p : {"ln1.weight", "ln1.bias", "qkv.weight", "qv_bias", "proj.weight", "proj.bias",
                              "ln2.weight", "ln2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}) {
          names.push_back(fmt::format("blocks.{}.{}", i, p));
        }
      }
    } else {
      names = {"embedding.word.weight", "head.norm.weight"};
      for (int64_t i = 0; i < L; ++i) {
        for (const char* p : {"attn_norm.weight", "q.weight", "k.weight", "v.weight", "o.weight", "mlp_norm.weight",
                              "gate.weight", "up.weight", "down.weight"}) {
          names.push_back(fmt::format("blocks.{}.{}", i, p));
        }
      }
    }
    names.push_back("head.output");
    for (const auto& n : names) {
      if (auto r = rule(n)) out.insert(full_name(r->hf));
    }
    out.insert(full_name("lm_head.weight"));  // tied: checked against the embedding
    return out;
  }

  std::vector<std::string> unused() const {
    const std::set<std::string> u = used();
    std::vector<std::string> out;
    static const std::regex buffers(R"(.*(attn\.bias|attn\.masked_bias|rotary_emb\.inv_freq))");
    for (const auto& n : dir_.names()) {
      if (u.count(n) == 0 && !std::regex_match(n, buffers)) out.push_back(n);
    }
    return out;
  }

 private:
  int64_t hidden() const { return config_.family == HfFamily::kGPT2 ? config_.gpt.hidden : config_.llama.hidden; }

  // lm_head is never prefixed; everything else carries the directory's prefix.
  std::string full_name(const std::string& hf) const { return hf == "lm_head.weight" ? hf : prefix_ + hf; }

  // The HF tensor (a view over the map), its shape checked against config.json.
  at::Tensor checked(const std::string& hf, const Shape& shape, const std::string& torus_name) const {
    const std::string n = full_name(hf);
    const ckpt::TensorEntry* e = dir_.find(n);
    TORUS_CHECK(e != nullptr, ckpt::CheckpointError, "{}: no tensor '{}' (the model's parameter '{}')", describe(), n,
                torus_name);
    TORUS_CHECK(e->shape == shape, ckpt::CheckpointError,
                "{}: '{}' has shape [{}], config.json implies [{}] (for the model's parameter '{}')", describe(), n,
                fmt::join(e->shape, ", "), fmt::join(shape, ", "), torus_name);
    return dir_.tensor(n);
  }

  // Note [QKV layout]: Torus row (head, j, d) is HF column j h + head hd + d
  // of the Conv1D weight [h, 3h]. A box of rows gathers just those columns.
  SourceTensor qkv(const at::Tensor& w, const std::string& origin) const {
    const int64_t h = config_.gpt.hidden, H = config_.gpt.num_heads, hd = config_.gpt.head_dim();
    SourceTensor s;
    s.shape = {3 * h, h};
    s.origin = origin + " re-laid head by head (transposed)";
    s.read = [w, h, H, hd](const Shape& offset, const Shape& size) {
      (void)H;
      at::Tensor rows = at::arange(offset[0], offset[0] + size[0], at::TensorOptions().dtype(at::kLong));
      at::Tensor head = rows.div(3 * hd, "floor"), j = rows.div(hd, "floor").remainder(3), d = rows.remainder(hd);
      at::Tensor cols = j * h + head * hd + d;
      // w.t() is [3h, h] (a view); index_select copies the selected rows only.
      return w.t().narrow(1, offset[1], size[1]).index_select(0, cols);
    };
    return s;
  }

  std::optional<Rule> rule(const std::string& name) const {
    using K = Rule::Kind;
    if (config_.family == HfFamily::kGPT2) {
      const models::GPTConfig& g = config_.gpt;
      const int64_t h = g.hidden, f = g.ffn(), V = g.vocab_size;
      if (name == "embedding.word.weight") return Rule{K::kSame, "wte.weight", {V, h}};
      if (name == "embedding.position") return Rule{K::kRows, "wpe.weight", {g.max_seq_len, h}, max_seq_};
      if (name == "head.ln_f.weight") return Rule{K::kSame, "ln_f.weight", {h}};
      if (name == "head.ln_f.bias") return Rule{K::kSame, "ln_f.bias", {h}};
      if (name == "head.output") {
        if (dir_.contains("lm_head.weight")) return Rule{K::kSame, "lm_head.weight", {V, h}};
        if (g.tie_embeddings) return Rule{K::kSame, "wte.weight", {V, h}};
        return Rule{K::kSame, "lm_head.weight", {V, h}};
      }
      std::string rest;
      const int64_t i = block_of(name, &rest);
      if (i < 0 || i >= g.num_layers) return std::nullopt;
      const std::string b = fmt::format("h.{}.", i);
      if (rest == "ln1.weight") return Rule{K::kSame, b + "ln_1.weight", {h}};
      if (rest == "ln1.bias") return Rule{K::kSame, b + "ln_1.bias", {h}};
      if (rest == "ln2.weight") return Rule{K::kSame, b + "ln_2.weight", {h}};
      if (rest == "ln2.bias") return Rule{K::kSame, b + "ln_2.bias", {h}};
      if (rest == "qkv.weight") return Rule{K::kQKV, b + "attn.c_attn.weight", {h, 3 * h}};
      if (rest == "qv_bias") return Rule{K::kQVBias, b + "attn.c_attn.bias", {3 * h}};
      if (rest == "proj.weight") return Rule{K::kTranspose, b + "attn.c_proj.weight", {h, h}};
      if (rest == "proj.bias") return Rule{K::kSame, b + "attn.c_proj.bias", {h}};
      if (rest == "fc1.weight") return Rule{K::kTranspose, b + "mlp.c_fc.weight", {h, f}};
      if (rest == "fc1.bias") return Rule{K::kSame, b + "mlp.c_fc.bias", {f}};
      if (rest == "fc2.weight") return Rule{K::kTranspose, b + "mlp.c_proj.weight", {f, h}};
      if (rest == "fc2.bias") return Rule{K::kSame, b + "mlp.c_proj.bias", {h}};
      return std::nullopt;
    }
    const models::LlamaConfig& l = config_.llama;
    const int64_t h = l.hidden, f = l.ffn(), V = l.vocab_size, qd = l.num_heads * l.dim_per_head(),
                  kd = l.kv_heads() * l.dim_per_head();
    if (name == "embedding.word.weight") return Rule{K::kSame, "embed_tokens.weight", {V, h}};
    if (name == "head.norm.weight") return Rule{K::kSame, "norm.weight", {h}};
    if (name == "head.output") {
      if (dir_.contains("lm_head.weight")) return Rule{K::kSame, "lm_head.weight", {V, h}};
      if (l.tie_embeddings) return Rule{K::kSame, "embed_tokens.weight", {V, h}};
      return Rule{K::kSame, "lm_head.weight", {V, h}};
    }
    std::string rest;
    const int64_t i = block_of(name, &rest);
    if (i < 0 || i >= l.num_layers) return std::nullopt;
    const std::string b = fmt::format("layers.{}.", i);
    if (rest == "attn_norm.weight") return Rule{K::kSame, b + "input_layernorm.weight", {h}};
    if (rest == "mlp_norm.weight") return Rule{K::kSame, b + "post_attention_layernorm.weight", {h}};
    if (rest == "q.weight") return Rule{K::kSame, b + "self_attn.q_proj.weight", {qd, h}};
    if (rest == "k.weight") return Rule{K::kSame, b + "self_attn.k_proj.weight", {kd, h}};
    if (rest == "v.weight") return Rule{K::kSame, b + "self_attn.v_proj.weight", {kd, h}};
    if (rest == "o.weight") return Rule{K::kSame, b + "self_attn.o_proj.weight", {h, qd}};
    if (rest == "gate.weight") return Rule{K::kSame, b + "mlp.gate_proj.weight", {f, h}};
    if (rest == "up.weight") return Rule{K::kSame, b + "mlp.up_proj.weight", {f, h}};
    if (rest == "down.weight") return Rule{K::kSame, b + "mlp.down_proj.weight", {h, f}};
    return std::nullopt;
  }

  ckpt::MappedWeightDir dir_;
  HfConfig config_;
  std::string prefix_;
  int64_t max_seq_ = -1;
};

}  // namespace

std::unique_ptr<WeightSource> hf_weight_source(const std::string& dir, const HfConfig& config, int64_t max_seq_len) {
  return std::make_unique<HfSource>(dir, config, max_seq_len);
}

std::vector<std::string> hf_unused_tensors(const std::string& dir, const HfConfig& config) {
  return HfSource(dir, config, -1).unused();
}

void load_hf_weights(Trainer& trainer, const std::string& dir) {
  const HfConfig hf = read_hf_config(dir);
  const std::string model = trainer.model().name();
  int64_t max_seq = -1;
  if (hf.family == HfFamily::kGPT2) {
    const auto* gm = dynamic_cast<const GPTModel*>(&trainer.model());
    TORUS_CHECK(model == "gpt" && gm != nullptr, InvalidArgument,
                "hf: {} holds a GPT-2 model, the trainer's model is '{}' (needs gpt)", dir, model);
    const models::GPTConfig& g = gm->config();
    TORUS_CHECK(g.num_heads == hf.gpt.num_heads, InvalidArgument,
                "hf: {} has n_head {}, the model {} heads (the QKV layout depends on it)", dir, hf.gpt.num_heads,
                g.num_heads);
    TORUS_CHECK(g.max_seq_len <= hf.gpt.max_seq_len, InvalidArgument,
                "hf: the model has {} positions, {} only {} (n_positions)", g.max_seq_len, dir, hf.gpt.max_seq_len);
    TORUS_CHECK(!(g.tie_embeddings && !hf.gpt.tie_embeddings), InvalidArgument,
                "hf: {} has an untied lm_head, the model ties its output layer to the embedding", dir);
    TORUS_CHECK(g.moe_every == 0, InvalidArgument, "hf: the model has MoE blocks, {} a dense GPT-2", dir);
    if (g.layernorm_eps != hf.gpt.layernorm_eps && trainer.mesh().world()->rank() == 0) {
      TORUS_LOG_WARN("hf: {} has layer_norm_epsilon {}, the model {}", dir, hf.gpt.layernorm_eps, g.layernorm_eps);
    }
    max_seq = g.max_seq_len;
  } else {
    // Sizes are checked by the tensors' shapes; what the shapes do not show
    // (the head split of the same width, the rotary embedding) here, since a
    // model that differs there computes other logits from the same weights.
    const auto* lm = dynamic_cast<const LlamaModel*>(&trainer.model());
    TORUS_CHECK(model == "llama" && lm != nullptr, InvalidArgument,
                "hf: {} holds a Llama model, the trainer's model is '{}' (needs llama)", dir, model);
    const models::LlamaConfig& l = lm->config();
    const models::LlamaConfig& h = hf.llama;
    TORUS_CHECK(l.num_heads == h.num_heads && l.kv_heads() == h.kv_heads() && l.dim_per_head() == h.dim_per_head(),
                InvalidArgument,
                "hf: {} has {} attention heads, {} key/value heads of {}; the model {}, {} of {} (--heads, --kv-heads)",
                dir, h.num_heads, h.kv_heads(), h.dim_per_head(), l.num_heads, l.kv_heads(), l.dim_per_head());
    TORUS_CHECK(l.rope_theta == h.rope_theta, InvalidArgument,
                "hf: {} has rope_theta {}, the model {} (--rope-theta)", dir, h.rope_theta, l.rope_theta);
    const models::RopeScaling &a = l.rope_scaling, &b = h.rope_scaling;
    const bool same_scaling = a.type == b.type &&
                              (a.type == "none" || (a.factor == b.factor && (a.type != "llama3" ||
                                                                             (a.low_freq_factor == b.low_freq_factor &&
                                                                              a.high_freq_factor == b.high_freq_factor &&
                                                                              a.original_max_position ==
                                                                                  b.original_max_position))));
    TORUS_CHECK(same_scaling, InvalidArgument,
                "hf: {} has RoPE scaling '{}' (factor {}), the model '{}' (factor {}): the rotary embedding differs "
                "(a model preset with that scaling, e.g. llama-1b)",
                dir, b.type, b.factor, a.type, a.factor);
    if (l.rms_eps != h.rms_eps && trainer.mesh().world()->rank() == 0) {
      TORUS_LOG_WARN("hf: {} has rms_norm_eps {}, the model {}", dir, h.rms_eps, l.rms_eps);
    }
  }
  auto source = std::make_unique<HfSource>(dir, hf, max_seq);
  if (trainer.mesh().world()->rank() == 0) {
    const std::vector<std::string> extra = source->unused();
    if (!extra.empty()) {
      TORUS_LOG_WARN("hf: {} holds {} tensors that no parameter of the model reads (ignored): {}{}", dir,
                     extra.size(), fmt::join(extra.begin(), extra.begin() + std::min<size_t>(extra.size(), 8), ", "),
                     extra.size() > 8 ? ", ..." : "");
    }
  }
  load_weights(trainer, *source);
}

}  // namespace torus::engine
