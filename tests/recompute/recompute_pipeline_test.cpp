// Activation recompute through the pipeline trainer (mpirun, 2 ranks, pp2):
// for one schedule (TORUS_TEST_SCHEDULE: gpipe, 1f1b, interleaved — two
// chunks per rank — or zb-h1) and every policy, 3 training steps with
// dropout reproduce the same steps without recompute: the losses, the
// gradient norms and the parameters each rank holds afterwards, within 1e-6
// (relative) in f32.
//
// Why the parameter comparison can see a gradient error: Adam's update
// m / (sqrt(v) + eps) is invariant to the gradient's scale when eps << |g|
// (a gradient twice too large moves no weight at the first step), and
// global-norm clipping rescales it too. So the optimizer here is configured
// to be linear in the gradient: eps = 1 >> |g| (gradients are ~1e-2), no
// clipping, no weight decay. The update is then lr g / (1 + |g|) ~ lr g, and
// a relative gradient error d moves a weight by ~ lr |g| d; with lr = 0.05
// that is >= 1e-3 d of the weights' scale, and the step's gradient norm
// (StepStats::grad_norm, before any update) is compared directly as well.
// In a pipeline the replay matters beyond the masks: several micro-batches'
// forwards run between a micro-batch's forward and its backward, so the
// replay must restore the streams to that micro-batch's state and then put
// them back; the losses of later steps check that.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "parallel/parallel_test_util.h"
#include "torus/models/gpt.h"
#include "torus/engine/gpt_model.h"

namespace torus::recompute {
namespace {

using testing::world;

constexpr int kSteps = 3;
constexpr int64_t kBatch = 8;

struct Trained {
  std::vector<double> losses;
  std::vector<double> norms;
  std::map<std::string, at::Tensor> weights;
  double max_update = 0;  // max |w_after - w_before| over every parameter, relative to max |w|
};

engine::ParallelLayout layout_from_env() {
  const char* env = std::getenv("TORUS_TEST_SCHEDULE");
  const std::string name = env ? env : "1f1b";
  engine::ParallelLayout l;
  l.pp = 2;
  l.num_micro = 4;
  l.schedule = pp::schedule_kind_from_name(name);
  if (l.schedule == pp::ScheduleKind::kInterleaved1F1B) l.num_chunks = 2;
  return l;
}

Trained train_with(const Policy& policy, const engine::ParallelLayout& layout) {
  models::GPTConfig config = models::GPTConfig::tiny();
  config.num_layers = 4;
  config.dropout = 0.1;
  config.attention_dropout = 0.1;
  config.recompute = policy;
  engine::OptimizerConfig optim;
  optim.lr = 0.05;
  optim.eps = 1.0;
  optim.weight_decay = 0;
  optim.grad_clip = 0;
  engine::GPTTrainer trainer(world(), config, layout, optim);
  Trained out;
  std::map<std::string, at::Tensor> before;  // copies: without TP the gathered tensors alias the parameters
  for (const auto& [name, w] : trainer.gather_local_parameters()) before[name] = w.detach().clone();
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor data = testing::same_tokens({kBatch, config.max_seq_len + 1}, config.vocab_size, 500 + step);
    const engine::StepStats st = trainer.train_step(data);
    EXPECT_FALSE(st.skipped);
    out.losses.push_back(st.loss);
    out.norms.push_back(st.grad_norm);
  }
  out.weights = trainer.gather_local_parameters();
  for (const auto& [name, w] : out.weights) out.max_update = std::max(out.max_update, testing::rel_diff(w, before.at(name)));
  return out;
}

TEST(RecomputePipeline, EveryPolicyTrainsLikeNoRecompute) {
  ASSERT_EQ(world()->size(), 2);
  const engine::ParallelLayout layout = layout_from_env();
  const Trained ref = train_with(Policy::none(), layout);
  EXPECT_GT(ref.max_update, 1e-3) << "the steps barely move the weights: the comparison would be blind";
  for (const Policy& policy : {Policy::full(), Policy::every(2), Policy::every(3), Policy::selective()}) {
    const Trained got = train_with(policy, layout);
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    double worst_loss = 0, worst_norm = 0, worst_weight = 0;
    for (size_t i = 0; i < ref.losses.size(); ++i) {
      const double dl = std::abs(got.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]);
      const double dn = std::abs(got.norms[i] - ref.norms[i]) / ref.norms[i];
      worst_loss = std::max(worst_loss, dl);
      worst_norm = std::max(worst_norm, dn);
      EXPECT_LE(dl, 1e-6) << policy.name() << " step " << i << ": loss " << got.losses[i] << " vs " << ref.losses[i];
      EXPECT_LE(dn, 1e-6) << policy.name() << " step " << i << ": grad norm " << got.norms[i] << " vs "
                          << ref.norms[i];
    }
    ASSERT_EQ(got.weights.size(), ref.weights.size());
    for (const auto& [name, w] : ref.weights) {
      ASSERT_TRUE(got.weights.count(name)) << name;
      const double d = testing::rel_diff(got.weights.at(name), w);
      worst_weight = std::max(worst_weight, d);
      EXPECT_LE(d, 1e-6) << policy.name() << " " << name;
    }
    if (world()->rank() == 0) {
      std::printf("[recompute] pp2 %s %-9s: loss %.6f -> %.6f, worst loss %.2e, norm %.2e, weight %.2e (largest "
                  "update %.2e of the weights)\n",
                  layout.describe().c_str(), policy.name().c_str(), ref.losses.front(), ref.losses.back(), worst_loss,
                  worst_norm, worst_weight, ref.max_update);
    }
  }
}

}  // namespace
}  // namespace torus::recompute
