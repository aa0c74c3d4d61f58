// The stage adapter of the decoders (gpt_model.cpp, llama_model.cpp): a
// models::GPT or models::Llama built for one pipeline part, seen through the
// engine's StageModule (engine/model.h). Private to the adapters.
//
// What a Net provides: forward(input), loss_of(output, labels), blocks()
// (each block optionally with moe()), rng(), set_block_hooks(hooks), and
// the torch::nn::Module parameters under global names. Global names:
// "blocks.<i>." prefixes carry the block index; with a tied embedding split
// over pipeline stages the last stage's copy is "head.output" (tie key
// "word_embedding"). Weight decay applies to parameters with two or more
// dimensions.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/log.h"
#include "torus/parallel/expert/moe.h"
#include "torus/parallel/tensor/sharding.h"
#include "torus/engine/model.h"

namespace torus::engine::detail {

inline constexpr const char* kTieKey = "word_embedding";

template <class Net>
class DecoderStage : public StageModule {
 public:
  DecoderStage(std::shared_ptr<Net> gpt, bool tied_copy_stage, bool tied_owner_stage)
      : gpt_(std::move(gpt)), tied_copy_stage_(tied_copy_stage), tied_owner_stage_(tied_owner_stage) {}

  std::shared_ptr<torch::nn::Module> module() const override { return gpt_; }
  at::Tensor forward(const at::Tensor& input) override { return gpt_->forward(input); }
  at::Tensor loss(const at::Tensor& output, const at::Tensor& labels) override { return gpt_->loss_of(output, labels); }

  std::vector<StageParameter> parameters() const override {
    const tp::ShardSpecs specs = tp::collect_shard_specs(*gpt_);
    std::set<const void*> expert_params;
    for (const auto& m : gpt_->modules()) {
      auto* holder = dynamic_cast<const ep::MoEParameters*>(m.get());
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

  at::Tensor full_logits(const at::Tensor& output, const comm::ProcessGroupPtr& tp) override {
    const int64_t vocab = gpt_->config().vocab_size;
    TORUS_CHECK(output.dim() == 3, InvalidArgument, "decoder stage: logits must be [seq, batch, vocab/tp], got {}-d",
                output.dim());
    const int n = tp ? tp->size() : 1;
    at::Tensor full = n > 1 ? tp::gather_full(output, tp::ShardSpec{.dim = 2, .full_size = vocab}, tp) : output;
    return full.narrow(2, 0, vocab).transpose(0, 1).contiguous();
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
  std::vector<std::shared_ptr<ep::MoELayer>> moe_layers() const {
    std::vector<std::shared_ptr<ep::MoELayer>> out;
    if constexpr (kHasMoE) {
      for (const auto& b : gpt_->blocks()) {
        if (b->moe()) out.push_back(b->moe());
      }
    }
    return out;
  }
  void set_loss_grad_scale(double scale) override {
    for (const auto& m : moe_layers()) m->set_loss_grad_scale(scale);
  }
  std::vector<ep::LayerRoutingStats> end_step(bool stepped) override {
    std::vector<ep::LayerRoutingStats> out;
    for (const auto& m : moe_layers()) out.push_back(m->end_step(stepped));
    return out;
  }
  std::map<std::string, at::Tensor> extra_state() const override {
    std::map<std::string, at::Tensor> out;
    for (const auto& m : moe_layers()) {
      if (m->bias().defined()) out[fmt::format("blocks.{}.moe.router.bias", m->layer())] = m->bias();
    }
    return out;
  }

  void set_rng_state(const std::map<std::string, at::Tensor>& state) override {
    auto get = [&](const char* name) {
      auto it = state.find(name);
      TORUS_CHECK(it != state.end(), InvalidArgument, "decoder stage: the RNG state has no '{}' stream", name);
      return it->second;
    };
    gpt_->rng()->set_state({get("replicated"), get("sharded")});
  }

 private:
  static constexpr bool kHasMoE = requires(const Net& n) { n.blocks().front()->moe(); };
  std::shared_ptr<Net> gpt_;
  bool tied_copy_stage_;
  bool tied_owner_stage_;
  int64_t first_layer_ = 0;
};

}  // namespace torus::engine::detail
