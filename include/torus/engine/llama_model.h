// torus/engine/llama_model.h — the model adapter of the Llama-family decoder
// (models/llama.h) for the training engine (trainer.h, model.h).
//
//   auto model = std::make_shared<torus::engine::LlamaModel>(torus::models::LlamaConfig::tiny());
//   torus::engine::Trainer trainer(world, model, layout, optim);
//
// The decoder is cut by models::llama_stage_parts (balanced by cost, or
// fixed layer counts per stage); every stage is a models::Llama built with
// its DecoderPart and the rank's TP group. Global names are the single-
// process model's (llama.h lists them); with a tied embedding and more than
// one stage the last stage's copy of the word embedding is "head.output"
// (tie key "word_embedding"). Weight decay applies to matrices and
// embeddings, not to the RMSNorm gains.
//
// FLOPs per token (the MFU numerator): 6 x (block and output-layer matmul
// parameters: L (h H d + 2 h K d + H d h + 3 h f) + V h) + 12 L H d s
// (attention scores and values, forward and backward).
#pragma once

#include <memory>

#include "torus/models/llama.h"
#include "torus/engine/model.h"

namespace torus::engine {

class LlamaModel : public Model {
 public:
  explicit LlamaModel(models::LlamaConfig config) : config_(std::move(config)) {}

  std::string name() const override { return "llama"; }
  void validate(const ModelLayout& layout) const override;
  void validate_sequence(int64_t seq_len, const ModelLayout& layout) const override;
  std::vector<std::string> describe_stages(const ModelLayout& layout) const override;
  std::unique_ptr<StageModule> build_stage(int stage, const ModelLayout& layout,
                                           const parallel::ParallelGroups& groups) const override;
  int64_t num_parameters() const override;
  double flops_per_token(int64_t seq_len) const override;
  // Parameters per piece and activations after Korthikanti et al., with the
  // SwiGLU MLP's three matrices and GQA's narrower keys and values.
  std::vector<RankMemoryShape> memory_shape(const ModelLayout& layout, int num_chunks, int64_t rows,
                                            int64_t seq) const override;
  std::string describe() const override;
  bool gives_logits() const override { return true; }
  std::string config_json() const override;
  c10::ScalarType param_dtype() const override { return config_.dtype; }
  c10::Device device() const override { return config_.device; }

  const models::LlamaConfig& config() const { return config_; }

 private:
  std::vector<models::DecoderPart> parts(const ModelLayout& layout) const;
  models::LlamaConfig config_;
};

}  // namespace torus::engine
