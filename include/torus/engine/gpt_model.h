// torus/engine/gpt_model.h — the model adapter of the reference GPT
// (models/gpt.h) for the training engine (trainer.h, model.h), and
// GPTTrainer, the engine built on it.
//
//   auto world = torus::init();
//   torus::engine::ParallelLayout layout{.tp = 2, .pp = 2, .dp = 2, .num_micro = 4};
//   torus::engine::GPTTrainer trainer(world, gpt_config, layout, optim_config);
//   auto stats = trainer.train_step(batch, lr);   // Trainer's API
//
// The GPT is cut by models::gpt_stage_parts (balanced by cost, or fixed
// layer counts per stage); every stage is a models::GPT built with its
// GPTPart (stage index included: per-stage dropout streams) and the rank's TP
// group. Global names are the single-process GPT's ("embedding.word.weight",
// "blocks.3.fc1.weight"); with tied embeddings and more than one stage the
// last stage's copy of the word embedding is "head.output" (tie key
// "word_embedding", the copy). Weight decay applies to parameters with two
// or more dimensions (matrices and embeddings), not to gains and biases.
//
// FLOPs per token (the MFU numerator): 6 x (block and output-layer matmul
// parameters: L (4h^2 + 2hf) + Vh) + 12 L h s (attention scores and values,
// forward and backward), as in Megatron-LM's and PaLM's accounting.
#pragma once

#include <memory>

#include "torus/models/gpt.h"
#include "torus/engine/model.h"
#include "torus/engine/trainer.h"

namespace torus::engine {

class GPTModel : public Model {
 public:
  explicit GPTModel(models::GPTConfig config) : config_(std::move(config)) {}

  std::string name() const override { return "gpt"; }
  void validate(const ModelLayout& layout) const override;
  void validate_sequence(int64_t seq_len, const ModelLayout& layout) const override;
  std::vector<std::string> describe_stages(const ModelLayout& layout) const override;
  std::unique_ptr<StageModule> build_stage(int stage, const ModelLayout& layout,
                                           const parallel::ParallelGroups& groups) const override;
  int64_t num_parameters() const override;
  double flops_per_token(int64_t seq_len) const override;
  // Parameters per piece and Korthikanti et al.'s activations of the cut.
  std::vector<RankMemoryShape> memory_shape(const ModelLayout& layout, int num_chunks, int64_t rows,
                                            int64_t seq) const override;
  std::pair<int64_t, int64_t> routing_shape() const override;
  std::string describe() const override;
  bool gives_logits() const override { return true; }
  std::string config_json() const override;
  c10::ScalarType param_dtype() const override { return config_.dtype; }
  c10::Device device() const override { return config_.device; }

  const models::GPTConfig& config() const { return config_; }

 private:
  std::vector<models::GPTPart> parts(const ModelLayout& layout) const;
  models::GPTConfig config_;
};

// The engine over a GPTModel. The model's sequence_parallel flag is taken
// from the layout.
class GPTTrainer : public Trainer {
 public:
  GPTTrainer(comm::ProcessGroupPtr world, models::GPTConfig model, ParallelLayout layout, OptimizerConfig optim = {},
             TrainerOptions options = {});
  const models::GPTConfig& model_config() const;
};

}  // namespace torus::engine
