// The GPT model adapter (gpt_model.h): the only place in the training engine
// that names the GPT.
#include "torus/engine/gpt_model.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "engine/adapters/decoder_stage.h"
#include "torus/parallel/tensor/sharding.h"

namespace torus::engine {
namespace {

models::GPTConfig with_layout(models::GPTConfig c, const ModelLayout& layout) {
  c.sequence_parallel = layout.sequence_parallel;
  return c;
}

}  // namespace

std::vector<models::GPTPart> GPTModel::parts(const ModelLayout& layout) const {
  return models::gpt_stage_parts(config_, layout.num_stages, config_.max_seq_len, layout.blocks_per_stage);
}

void GPTModel::validate(const ModelLayout& layout) const {
  with_layout(config_, layout).validate(layout.tp);
  if (config_.moe_every > 0) {
    const ep::MoEConfig moe = config_.moe_config();
    moe.validate(layout.ep);
    // Checked here, on every rank, because only the stages with an MoE block build one.
    TORUS_CHECK(!moe.expert_tensor_parallel || layout.tp == 1 || moe.ffn_hidden % layout.tp == 0, InvalidArgument,
                "GPTModel: expert tensor parallelism splits each expert's width {} over tp={}, which does not divide it",
                moe.ffn_hidden, layout.tp);
  }
  TORUS_CHECK(layout.ep == 1 || config_.moe_every > 0, InvalidArgument,
              "GPTModel: ep={} needs MoE blocks (moe_every > 0)", layout.ep);
  (void)parts(layout);
}

void GPTModel::validate_sequence(int64_t seq_len, const ModelLayout& layout) const {
  with_layout(config_, layout).validate_sequence(seq_len, layout.tp);
}

std::vector<std::string> GPTModel::describe_stages(const ModelLayout& layout) const {
  std::vector<std::string> out;
  for (const auto& part : parts(layout)) out.push_back(models::describe_part(part, config_.num_layers));
  return out;
}

std::unique_ptr<StageModule> GPTModel::build_stage(int stage, const ModelLayout& layout,
                                                   const parallel::ParallelGroups& groups) const {
  const std::vector<models::GPTPart> all = parts(layout);
  TORUS_CHECK(stage >= 0 && stage < static_cast<int>(all.size()), InvalidArgument,
              "GPTModel: stage {} of {} stages", stage, all.size());
  const models::GPTPart& part = all[stage];
  const bool split_tie = config_.tie_embeddings && layout.num_stages > 1;
  auto gpt = std::make_shared<models::GPT>(with_layout(config_, layout), groups, part);
  auto s = std::make_unique<detail::DecoderStage<models::GPT>>(gpt, split_tie && part.head && !part.embedding,
                                      split_tie && part.embedding && !part.head);
  s->set_first_layer(part.first_layer);
  return s;
}

int64_t GPTModel::num_parameters() const {
  const int64_t h = config_.hidden, L = config_.num_layers, f = config_.ffn(), v = config_.vocab_size;
  const int64_t attention = 2 * h + (3 * h * h + 2 * h) + (h * h + h) + 2 * h;
  const int64_t dense_mlp = (h * f + f) + (f * h + h);
  const ep::MoEConfig moe = config_.moe_config();
  const int64_t fm = moe.ffn_hidden;
  const int64_t moe_mlp = moe.num_experts * ((h * fm + fm) + (fm * h + h)) + moe.num_experts * h;
  const int64_t M = config_.num_moe_blocks();
  int64_t n = v * h + config_.max_seq_len * h + L * attention + (L - M) * dense_mlp + M * moe_mlp + 2 * h;
  if (!config_.tie_embeddings) n += v * h;
  return n;
}

// An MoE block counts the k experts a token runs through and the router.
double GPTModel::flops_per_token(int64_t seq_len) const {
  const double h = config_.hidden, L = config_.num_layers, f = config_.ffn(), v = config_.vocab_size;
  const ep::MoEConfig moe = config_.moe_config();
  const double M = static_cast<double>(config_.num_moe_blocks());
  const double moe_mlp = 2 * h * static_cast<double>(moe.ffn_hidden) * static_cast<double>(moe.top_k) +
                         h * static_cast<double>(moe.num_experts);
  const double matmul_params = L * 4 * h * h + (L - M) * 2 * h * f + M * moe_mlp + v * h;
  return 6.0 * matmul_params + 12.0 * L * h * static_cast<double>(seq_len);
}

std::pair<int64_t, int64_t> GPTModel::routing_shape() const {
  if (config_.moe_every <= 0) return {0, 0};
  return {config_.num_layers, config_.moe.num_experts};
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one block's activations for one micro-batch at 16-bit, after
// Korthikanti et al. 2022; `attention`: include the 5 a s / h term.
double block_activation_16(int64_t s, int64_t b, int64_t h, int64_t a, int t, bool sp, bool attention) {
  const double sbh = static_cast<double>(s) * b * h;
  const double att = attention ? 5.0 * a * s / h : 0.0;
  if (t == 1 || sp) return sbh * (34.0 + att) / t;
  return sbh * (10.0 + 24.0 / t + att / t);
}

// Note [MoE activations]: an MoE block saves, in place of the dense MLP's
// 19 sbh/t (t = 1 or sequence parallel; else 3 sbh whole — fc1's input and
// the dropout mask — and 16 sbh/t of fc1's and GeLU's outputs), for each of
// the k assignments of the s·b/t tokens this rank routes (the layer scatters
// its input over tp when the sequence is not split already,
// MoELayer::forward): the expert's input and output (2h bytes each) and
// fc1's and the activation's outputs (2 f_e each). With --expert-tp a rank
// runs its f_e/t slice of each expert on the rows of all t tp ranks: fc1's
// saved input is t times as many rows, its outputs the same bytes. With a
// capacity factor c < 1 at most c of the assignments are kept (balanced
// over the ep ranks, each receives its share). Per routed token the
// router's f32 logits, probabilities and their gradient (12 E bytes); per
// token of the block's input the dropout mask (h bytes).
double dense_mlp_activation_16(int64_t s, int64_t b, int64_t h, int t, bool sp) {
  const double sbh = static_cast<double>(s) * b * h;
  if (t == 1 || sp) return 19.0 * sbh / t;
  return sbh * (3.0 + 16.0 / t);
}

double moe_mlp_activation_16(int64_t s, int64_t b, int64_t h, int t, bool sp, const ep::MoEConfig& moe) {
  const double routed = static_cast<double>(s) * b / t;
  const double kept = static_cast<double>(moe.top_k) * routed *
                      (moe.capacity_factor > 0 ? std::min(1.0, moe.capacity_factor) : 1.0);
  const double te = moe.expert_tensor_parallel ? t : 1;
  return kept * (2.0 * h * te + 2.0 * h + 4.0 * moe.ffn_hidden) + routed * 12.0 * moe.num_experts +
         static_cast<double>(s) * b * h / (sp ? t : 1);
}

}  // namespace

std::vector<RankMemoryShape> GPTModel::memory_shape(const ModelLayout& layout, int num_chunks, int64_t rows,
                                                    int64_t seq) const {
  const models::GPTConfig& g = config_;
  const int t = layout.tp;
  const int pp = layout.num_stages / std::max(num_chunks, 1);
  const int64_t h = g.hidden, f = g.ffn(), V = g.vocab_size;
  // The parameter counts of num_parameters(), per piece (this TP rank's shards).
  const int64_t block = ceil_div(4 * h * h + 2 * h * f + 8 * h + f, t);
  // An MoE block: attention and norms as a dense block; the router (whole on
  // every rank) and this ep rank's experts, split over TP with --expert-tp
  // (fc2's bias whole), in place of the dense MLP.
  const ep::MoEConfig moe = g.moe_config();
  const int te = moe.expert_tensor_parallel ? t : 1;
  const int64_t moe_block = ceil_div(4 * h * h + 7 * h, t) + moe.num_experts * h +
                            moe.num_experts / std::max(layout.ep, 1) *
                                (ceil_div(2 * h * moe.ffn_hidden + moe.ffn_hidden, te) + h);
  const int64_t embedding = ceil_div(V * h, t) + g.max_seq_len * h;
  const int64_t word = ceil_div(V * h, t);
  const std::vector<models::GPTPart> all = parts(layout);
  const double full16 = block_activation_16(seq, rows, h, g.num_heads, t, layout.sequence_parallel, true);
  const double selective16 = block_activation_16(seq, rows, h, g.num_heads, t, layout.sequence_parallel, false);
  const double input16 = 2.0 * seq * rows * h / (layout.sequence_parallel ? t : 1);
  // Note [MoE activations]: an MoE block's MLP in place of the dense one's.
  const double moe_delta =
      g.moe_every > 0 ? moe_mlp_activation_16(seq, rows, h, t, layout.sequence_parallel, moe) -
                            dense_mlp_activation_16(seq, rows, h, t, layout.sequence_parallel)
                      : 0.0;
  const double logits = 8.0 * seq * rows * static_cast<double>(ceil_div(V, t));  // f32 logits and their gradient
  std::vector<RankMemoryShape> out(pp);
  for (int r = 0; r < pp; ++r) {
    RankMemoryShape& rs = out[r];
    bool recomputes = false;
    double recomputed_peak = 0;
    for (int c = 0; c < num_chunks; ++c) {
      const models::GPTPart& p = all[static_cast<size_t>(c) * pp + r];
      const int64_t n = p.num_layers < 0 ? g.num_layers - p.first_layer : p.num_layers;
      rs.blocks += n;
      if (p.embedding) rs.outside_params += embedding;
      if (p.head) {
        rs.head_bytes = logits;
        rs.outside_params += 2 * h;
        // The head's weight: its own when untied; a copy of the word
        // embedding when tied and the embedding is on another stage.
        if (!g.tie_embeddings || !p.embedding) rs.outside_params += word;
      }
      for (int64_t i = p.first_layer; i < p.first_layer + n; ++i) {
        const bool is_moe = g.is_moe_block(i);
        const int64_t params = is_moe ? moe_block : block;
        const double extra = is_moe ? moe_delta : 0.0;
        rs.block_params += params;
        rs.largest_block = std::max(rs.largest_block, params);
        if (g.recompute.recompute_block(i)) {
          rs.activations_16 += input16;
          recomputes = true;
          recomputed_peak = std::max(recomputed_peak, full16 + extra);
        } else if (g.recompute.recompute_attention_core()) {
          rs.activations_16 += selective16 + extra;
        } else {
          rs.activations_16 += full16 + extra;
        }
      }
    }
    if (recomputes) rs.recompute_extra_16 = recomputed_peak;  // one block recomputed in backward
  }
  return out;
}

std::string GPTModel::describe() const {
  const models::GPTConfig& c = config_;
  std::string out = fmt::format("gpt: {} layers, width {}, {} heads, ffn {}, vocab {}, context {}{}", c.num_layers,
                                c.hidden, c.num_heads, c.ffn(), c.vocab_size, c.max_seq_len,
                                c.tie_embeddings ? ", tied" : "");
  if (c.moe_every > 0) {
    out += fmt::format(", MoE every {} ({} experts, top-{})", c.moe_every, c.moe.num_experts, c.moe.top_k);
  }
  return out;
}

std::string GPTModel::config_json() const {
  const models::GPTConfig& c = config_;
  nlohmann::json j = {{"family", "gpt"},
                      {"vocab_size", c.vocab_size},
                      {"max_seq_len", c.max_seq_len},
                      {"num_layers", c.num_layers},
                      {"hidden", c.hidden},
                      {"num_heads", c.num_heads},
                      {"ffn_hidden", c.ffn()},
                      {"layernorm_eps", c.layernorm_eps},
                      {"tie_embeddings", c.tie_embeddings},
                      {"moe_every", c.moe_every}};
  if (c.moe_every > 0) {
    j["experts"] = c.moe.num_experts;
    j["top_k"] = c.moe.top_k;
    j["moe_ffn"] = c.moe_config().ffn_hidden;
  }
  return j.dump();
}

GPTTrainer::GPTTrainer(comm::ProcessGroupPtr world, models::GPTConfig model, ParallelLayout layout,
                       OptimizerConfig optim, TrainerOptions options)
    : Trainer(std::move(world), std::make_shared<GPTModel>(std::move(model)), std::move(layout), optim, options) {}

const models::GPTConfig& GPTTrainer::model_config() const {
  return static_cast<const GPTModel&>(model()).config();
}

}  // namespace torus::engine
