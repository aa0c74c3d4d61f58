// The GPT model adapter (gpt_model.h): the only place in the training engine
// that names the GPT.
#include "torus/train/gpt_model.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <set>

#include "core/log.h"
#include "torus/parallel/tensor/sharding.h"

namespace torus::train {
namespace {

constexpr const char* kTieKey = "word_embedding";

class GPTStage : public StageModule {
 public:
  GPTStage(std::shared_ptr<models::GPT> gpt, bool tied_copy_stage, bool tied_owner_stage)
      : gpt_(std::move(gpt)), tied_copy_stage_(tied_copy_stage), tied_owner_stage_(tied_owner_stage) {}

  std::shared_ptr<torch::nn::Module> module() const override { return gpt_; }
  at::Tensor forward(const at::Tensor& input) override { return gpt_->forward(input); }
  at::Tensor loss(const at::Tensor& output, const at::Tensor& labels) override {
    TORUS_CHECK(gpt_->head() != nullptr, InvalidArgument, "GPT stage: loss() on a stage without the head");
    return gpt_->head()->loss(output, labels);
  }

  std::vector<StageParameter> parameters() const override {
    const tp::ShardSpecs specs = tp::collect_shard_specs(*gpt_);
    std::set<const void*> expert_params;
    for (const auto& m : gpt_->modules()) {
      auto* holder = dynamic_cast<const expert::MoEParameters*>(m.get());
      if (!holder || !holder->expert()) continue;
      for (const auto& p : holder->parameters(/*recurse=*/false)) expert_params.insert(p.unsafeGetTensorImpl());
    }
    std::vector<StageParameter> out;
    for (const auto& item : gpt_->named_parameters()) {
      StageParameter p;
      p.name = item.key();
      p.tensor = item.value();
      auto spec = specs.find(item.key());
      if (spec != specs.end()) p.spec = spec->second;
      p.weight_decay = p.tensor.dim() >= 2;
      if (tied_copy_stage_ && p.name == "head.output") {
        p.tie_key = kTieKey;
        p.tie_copy = true;
        p.tied_to = "embedding.word.weight";
      }
      if (tied_owner_stage_ && p.name == "embedding.word.weight") p.tie_key = kTieKey;
      if (p.name.rfind("blocks.", 0) == 0) p.block = std::stoll(p.name.substr(7, p.name.find('.', 7) - 7));
      p.expert = expert_params.count(p.tensor.unsafeGetTensorImpl()) > 0;
      out.push_back(std::move(p));
    }
    return out;
  }

  std::map<std::string, at::Tensor> gather_full_parameters(const comm::ProcessGroupPtr& tp) const override {
    return tp::gather_full_parameters(*gpt_, tp);
  }

  std::vector<int64_t> block_layers() const override {
    std::vector<int64_t> out;
    const int64_t first = gpt_->blocks().empty() ? 0 : first_layer_;
    for (size_t i = 0; i < gpt_->blocks().size(); ++i) out.push_back(first + static_cast<int64_t>(i));
    return out;
  }
  void set_first_layer(int64_t first) { first_layer_ = first; }
  bool set_block_hooks(std::shared_ptr<parallel::BlockHooks> hooks) override {
    gpt_->set_block_hooks(std::move(hooks));
    return true;
  }

  std::map<std::string, at::Tensor> rng_state() const override {
    const tp::RngTracker::State st = gpt_->rng()->get_state();
    return {{"replicated", st.replicated}, {"sharded", st.sharded}};
  }
  std::vector<std::shared_ptr<expert::MoELayer>> moe_layers() const {
    std::vector<std::shared_ptr<expert::MoELayer>> out;
    for (const auto& b : gpt_->blocks()) {
      if (b->moe()) out.push_back(b->moe());
    }
    return out;
  }
  void set_loss_grad_scale(double scale) override {
    for (const auto& m : moe_layers()) m->set_loss_grad_scale(scale);
  }
  std::vector<expert::LayerRoutingStats> end_step(bool stepped) override {
    std::vector<expert::LayerRoutingStats> out;
    for (const auto& m : moe_layers()) out.push_back(m->end_step(stepped));
    return out;
  }
  std::map<std::string, at::Tensor> extra_state() const override {
    std::map<std::string, at::Tensor> out;
    for (const auto& b : gpt_->blocks()) {
      if (b->moe() && b->moe()->bias().defined()) {
        out[fmt::format("blocks.{}.moe.router.bias", b->moe()->layer())] = b->moe()->bias();
      }
    }
    return out;
  }

  void set_rng_state(const std::map<std::string, at::Tensor>& state) override {
    auto get = [&](const char* name) {
      auto it = state.find(name);
      TORUS_CHECK(it != state.end(), InvalidArgument, "GPT stage: the RNG state has no '{}' stream", name);
      return it->second;
    };
    gpt_->rng()->set_state({get("replicated"), get("sharded")});
  }

 private:
  std::shared_ptr<models::GPT> gpt_;
  bool tied_copy_stage_;
  bool tied_owner_stage_;
  int64_t first_layer_ = 0;
};

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
  if (config_.moe_every > 0) config_.moe_config().validate(layout.ep);
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
  auto s = std::make_unique<GPTStage>(gpt, split_tie && part.head && !part.embedding,
                                      split_tie && part.embedding && !part.head);
  s->set_first_layer(part.first_layer);
  return s;
}

int64_t GPTModel::num_parameters() const {
  const int64_t h = config_.hidden, L = config_.num_layers, f = config_.ffn(), v = config_.vocab_size;
  const int64_t attention = 2 * h + (3 * h * h + 2 * h) + (h * h + h) + 2 * h;
  const int64_t dense_mlp = (h * f + f) + (f * h + h);
  const expert::MoEConfig moe = config_.moe_config();
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
  const expert::MoEConfig moe = config_.moe_config();
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

}  // namespace

std::vector<RankMemoryShape> GPTModel::memory_shape(const ModelLayout& layout, int num_chunks, int64_t rows,
                                                    int64_t seq) const {
  const models::GPTConfig& g = config_;
  const int t = layout.tp;
  const int pp = layout.num_stages / std::max(num_chunks, 1);
  const int64_t h = g.hidden, f = g.ffn(), V = g.vocab_size;
  // The parameter counts of num_parameters(), per piece (this TP rank's shards).
  const int64_t block = ceil_div(4 * h * h + 2 * h * f + 8 * h + f, t);
  const int64_t embedding = ceil_div(V * h, t) + g.max_seq_len * h;
  const int64_t word = ceil_div(V * h, t);
  const std::vector<models::GPTPart> all = parts(layout);
  const double full16 = block_activation_16(seq, rows, h, g.num_heads, t, layout.sequence_parallel, true);
  const double selective16 = block_activation_16(seq, rows, h, g.num_heads, t, layout.sequence_parallel, false);
  const double input16 = 2.0 * seq * rows * h / (layout.sequence_parallel ? t : 1);
  const double logits = 8.0 * seq * rows * static_cast<double>(ceil_div(V, t));  // f32 logits and their gradient
  std::vector<RankMemoryShape> out(pp);
  for (int r = 0; r < pp; ++r) {
    RankMemoryShape& rs = out[r];
    bool recomputes = false;
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
        if (g.recompute.recompute_block(i)) {
          rs.activations_16 += input16;
          recomputes = true;
        } else if (g.recompute.recompute_attention_core()) {
          rs.activations_16 += selective16;
        } else {
          rs.activations_16 += full16;
        }
      }
    }
    rs.block_params = rs.blocks * block;
    rs.largest_block = rs.blocks > 0 ? block : 0;
    if (recomputes) rs.recompute_extra_16 = full16;  // one block recomputed in backward
  }
  return out;
}

GPTTrainer::GPTTrainer(comm::ProcessGroupPtr world, models::GPTConfig model, ParallelLayout layout,
                       OptimizerConfig optim, TrainerOptions options)
    : Trainer(std::move(world), std::make_shared<GPTModel>(std::move(model)), std::move(layout), optim, options) {}

const models::GPTConfig& GPTTrainer::model_config() const {
  return static_cast<const GPTModel&>(model()).config();
}

}  // namespace torus::train
