// The Llama model adapter (llama_model.h): the only place in the training
// engine that names the Llama.
#include "torus/engine/llama_model.h"

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "engine/adapters/decoder_stage.h"

namespace torus::engine {
namespace {

models::LlamaConfig with_layout(models::LlamaConfig c, const ModelLayout& layout) {
  c.sequence_parallel = layout.sequence_parallel;
  return c;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::vector<models::DecoderPart> LlamaModel::parts(const ModelLayout& layout) const {
  return models::llama_stage_parts(config_, layout.num_stages, config_.max_seq_len, layout.blocks_per_stage);
}

void LlamaModel::validate(const ModelLayout& layout) const {
  with_layout(config_, layout).validate(layout.tp);
  TORUS_CHECK(layout.ep == 1, InvalidArgument, "LlamaModel: ep={} needs MoE blocks, which the Llama has not",
              layout.ep);
  (void)parts(layout);
}

void LlamaModel::validate_sequence(int64_t seq_len, const ModelLayout& layout) const {
  with_layout(config_, layout).validate_sequence(seq_len, layout.tp);
}

std::vector<std::string> LlamaModel::describe_stages(const ModelLayout& layout) const {
  std::vector<std::string> out;
  for (const auto& part : parts(layout)) out.push_back(models::describe_part(part, config_.num_layers));
  return out;
}

std::unique_ptr<StageModule> LlamaModel::build_stage(int stage, const ModelLayout& layout,
                                                     const parallel::ParallelGroups& groups) const {
  const std::vector<models::DecoderPart> all = parts(layout);
  TORUS_CHECK(stage >= 0 && stage < static_cast<int>(all.size()), InvalidArgument,
              "LlamaModel: stage {} of {} stages", stage, all.size());
  const models::DecoderPart& part = all[stage];
  const bool split_tie = config_.tie_embeddings && layout.num_stages > 1;
  auto net = std::make_shared<models::Llama>(with_layout(config_, layout), groups, part);
  auto s = std::make_unique<detail::DecoderStage<models::Llama>>(net, split_tie && part.head && !part.embedding,
                                                                 split_tie && part.embedding && !part.head);
  s->set_first_layer(part.first_layer);
  return s;
}

int64_t LlamaModel::num_parameters() const {
  const models::LlamaConfig& c = config_;
  const int64_t h = c.hidden, d = c.dim_per_head(), q = c.num_heads * d, kv = c.kv_heads() * d, f = c.ffn();
  const int64_t block = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * f;
  int64_t n = c.vocab_size * h + c.num_layers * block + h;
  if (!c.tie_embeddings) n += c.vocab_size * h;
  return n;
}

double LlamaModel::flops_per_token(int64_t seq_len) const {
  const models::LlamaConfig& c = config_;
  const double h = c.hidden, L = c.num_layers, d = c.dim_per_head(), f = c.ffn(), v = c.vocab_size;
  const double q = c.num_heads * d, kv = c.kv_heads() * d;
  const double matmul_params = L * (h * q + 2 * h * kv + q * h + 3 * h * f) + v * h;
  return 6.0 * matmul_params + 12.0 * L * q * static_cast<double>(seq_len);
}

std::vector<RankMemoryShape> LlamaModel::memory_shape(const ModelLayout& layout, int num_chunks, int64_t rows,
                                                      int64_t seq) const {
  const models::LlamaConfig& c = config_;
  const int t = layout.tp;
  const bool sp = layout.sequence_parallel;
  const int pp = layout.num_stages / std::max(num_chunks, 1);
  const int64_t h = c.hidden, d = c.dim_per_head(), q = c.num_heads * d, kv = c.kv_heads() * d, f = c.ffn();
  const int64_t V = c.vocab_size;
  const bool kv_split = c.kv_split(t);
  // This TP rank's shards: q, o, gate, up, down split; k, v split or whole; the gains whole.
  const int64_t block = ceil_div(2 * h * q + 3 * h * f, t) + (kv_split ? ceil_div(2 * h * kv, t) : 2 * h * kv) + 2 * h;
  const int64_t word = ceil_div(V * h, t);
  // Bytes at 16-bit kept for backward by one block and micro-batch: the
  // norms' and projections' inputs (4 x s b h: replicated over TP unless
  // SP), and per rank q, k, v before and after the rotation, the attention
  // output (flash attention keeps no s x s matrix), and the MLP's four
  // f-wide tensors.
  const double sb = static_cast<double>(seq) * static_cast<double>(rows);
  const double kv_local = kv_split ? static_cast<double>(kv) / t : static_cast<double>(kv);
  const double q_local = static_cast<double>(q) / t;
  const double replicated = 2.0 * 4 * sb * h / (sp ? t : 1);
  const double sharded = 2.0 * sb * (4 * q_local + 2 * q_local * 2 + 2 * kv_local + 4.0 * f / t);
  const double full16 = replicated + sharded;
  const double selective16 = full16 - 2.0 * sb * q_local;
  const double input16 = 2.0 * sb * h / (sp ? t : 1);
  const double logits = 8.0 * sb * static_cast<double>(ceil_div(V, t));
  const std::vector<models::DecoderPart> all = parts(layout);
  std::vector<RankMemoryShape> out(pp);
  for (int r = 0; r < pp; ++r) {
    RankMemoryShape& rs = out[r];
    bool recomputes = false;
    for (int k = 0; k < num_chunks; ++k) {
      const models::DecoderPart& p = all[static_cast<size_t>(k) * pp + r];
      const int64_t n = p.num_layers < 0 ? c.num_layers - p.first_layer : p.num_layers;
      rs.blocks += n;
      if (p.embedding) rs.outside_params += word;
      if (p.head) {
        rs.head_bytes = logits;
        rs.outside_params += h;
        if (!c.tie_embeddings || !p.embedding) rs.outside_params += word;
      }
      for (int64_t i = p.first_layer; i < p.first_layer + n; ++i) {
        if (c.recompute.recompute_block(i)) {
          rs.activations_16 += input16;
          recomputes = true;
        } else {
          rs.activations_16 += c.recompute.recompute_attention_core() ? selective16 : full16;
        }
      }
    }
    rs.block_params = rs.blocks * block;
    rs.largest_block = rs.blocks > 0 ? block : 0;
    if (recomputes) rs.recompute_extra_16 = full16;
  }
  return out;
}

std::string LlamaModel::describe() const {
  const models::LlamaConfig& c = config_;
  std::string rope = fmt::format("rope {:g}", c.rope_theta);
  if (c.rope_scaling.type != "none") rope += fmt::format(" ({} x{:g})", c.rope_scaling.type, c.rope_scaling.factor);
  return fmt::format("llama: {} layers, width {}, {} heads ({} kv, dim {}), ffn {}, vocab {}, {}{}", c.num_layers,
                     c.hidden, c.num_heads, c.kv_heads(), c.dim_per_head(), c.ffn(), c.vocab_size, rope,
                     c.tie_embeddings ? ", tied" : "");
}

std::string LlamaModel::config_json() const {
  const models::LlamaConfig& c = config_;
  nlohmann::json j = {{"family", "llama"},
                      {"vocab_size", c.vocab_size},
                      {"max_seq_len", c.max_seq_len},
                      {"num_layers", c.num_layers},
                      {"hidden", c.hidden},
                      {"num_heads", c.num_heads},
                      {"num_kv_heads", c.kv_heads()},
                      {"head_dim", c.dim_per_head()},
                      {"ffn_hidden", c.ffn()},
                      {"rms_eps", c.rms_eps},
                      {"rope_theta", c.rope_theta},
                      {"rope_scaling",
                       {{"type", c.rope_scaling.type},
                        {"factor", c.rope_scaling.factor},
                        {"low_freq_factor", c.rope_scaling.low_freq_factor},
                        {"high_freq_factor", c.rope_scaling.high_freq_factor},
                        {"original_max_position", c.rope_scaling.original_max_position}}},
                      {"tie_embeddings", c.tie_embeddings}};
  return j.dump();
}

}  // namespace torus::engine
