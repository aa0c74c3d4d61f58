// The correctness contract: 20 AdamW steps of the tiny GPT in one parallel
// layout reproduce single-process training — the losses within 1e-5
// (relative) and the final gathered weights within 1e-4 (max |difference|
// over max |weight|, per parameter) in f32; both within 1e-10 in f64; in
// bf16, Note [Half-precision contract].
//
// One binary serves every layout; TORUS_TEST_LAYOUT names the one to run
// ("single", "dp2", "dp3", "tp2", "tp2,sp", "tp2,dp2", "tp4", ...; the
// product of the sizes must equal the number of ranks). Every rank also
// trains the single-process reference itself (same seed and data, the whole
// batch, no communication) and compares against it: no stored numbers.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cstdlib>
#include <sstream>

#include "parallel/parallel_test_util.h"
#include "torus/models/gpt.h"
#include "torus/parallel/data/ddp.h"
#include "torus/parallel/tensor/mappings.h"
#include "torus/parallel/tensor/sharding.h"

namespace torus::models {
namespace {

using testing::world;

struct Layout {
  int dp = 1;
  int tp = 1;
  bool sp = false;
  std::string name;
};

Layout layout_from_env() {
  Layout l;
  const char* env = std::getenv("TORUS_TEST_LAYOUT");
  l.name = env ? env : "";
  if (l.name.empty() || l.name == "single") {
    l.dp = world()->size();
    if (l.name.empty()) l.name = "dp" + std::to_string(l.dp);
    return l;
  }
  std::stringstream ss(l.name);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part == "sp") {
      l.sp = true;
    } else if (part.rfind("tp", 0) == 0) {
      l.tp = std::stoi(part.substr(2));
    } else if (part.rfind("dp", 0) == 0) {
      l.dp = std::stoi(part.substr(2));
    } else {
      throw InvalidArgument("TORUS_TEST_LAYOUT: unknown part '" + part + "'");
    }
  }
  return l;
}

constexpr int kSteps = 20;
constexpr int64_t kBatch = 12;  // divisible by every dp size tested (1, 2, 3, 4)

struct Trained {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> weights;  // full, unpadded
};

// A learnable stream: random first tokens, then t' = (3 t + 7) mod vocab.
at::Tensor batch(const GPTConfig& config, int step) {
  at::Tensor data = testing::same_tokens({kBatch, config.max_seq_len + 1}, config.vocab_size, 100 + step);
  for (int64_t i = 1; i < data.size(1); ++i)
    data.select(1, i).copy_((data.select(1, i - 1) * 3 + 7) % config.vocab_size);
  return data;
}

Trained train(const GPTConfig& config, const parallel::ParallelGroups& groups) {
  auto model = std::make_shared<GPT>(config, groups);
  // The wrapper is used whenever anything must be reduced: dp > 1, or partial
  // gradients over TP (sequence parallelism).
  std::unique_ptr<dp::DistributedDataParallel> ddp;
  if (groups.dp_size() > 1 || groups.tp_size() > 1) {
    ddp = std::make_unique<dp::DistributedDataParallel>(model, groups);
  }
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.1));
  Trained out;
  const int dp = groups.dp_size(), d = groups.dp_rank();
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor data = batch(config, step);
    at::Tensor local = data.chunk(dp, 0)[d];
    at::Tensor inputs = local.narrow(1, 0, config.max_seq_len).contiguous();
    at::Tensor labels = local.narrow(1, 1, config.max_seq_len).contiguous();
    at::Tensor loss = model->loss(inputs, labels);
    loss.backward();  // the DP wrapper finishes its all-reduces at the end of backward
    opt.step();
    if (ddp) {
      ddp->zero_grad();
    } else {
      opt.zero_grad();
    }
    at::Tensor l = loss.detach().to(at::kDouble).reshape({1});
    if (dp > 1) groups.dp->all_reduce(l, {.op = comm::ReduceOp::kAvg})->wait();  // the global-batch mean
    out.losses.push_back(l.item<double>());
  }
  out.weights = tp::gather_full_parameters(*model, groups.tp);
  return out;
}

void check_contract(at::ScalarType dtype, double loss_tol, double weight_tol) {
  const Layout layout = layout_from_env();
  ASSERT_EQ(layout.dp * layout.tp, world()->size())
      << "layout " << layout.name << " needs " << layout.dp * layout.tp << " ranks";
  GPTConfig config = GPTConfig::tiny();
  config.dtype = dtype;
  config.sequence_parallel = layout.sp;
  const auto& groups = testing::mesh_groups(layout.dp, layout.tp);

  GPTConfig single_config = config;
  single_config.sequence_parallel = false;
  const Trained ref = train(single_config, {});
  const Trained got = train(config, groups);
  const bool half = dtype == at::kBFloat16 || dtype == at::kHalf;
  const double u = dtype == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);  // if half
  Trained ref32;
  if (half) {
    GPTConfig f32_config = single_config;
    f32_config.dtype = at::kFloat;
    ref32 = train(f32_config, {});
  }

  ASSERT_EQ(got.losses.size(), ref.losses.size());
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the reference did not learn";
  double worst_loss = 0, worst_weight = 0;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    const double rel = std::abs(got.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]);
    worst_loss = std::max(worst_loss, rel);
    EXPECT_LE(rel, loss_tol) << "step " << i << ": " << got.losses[i] << " vs " << ref.losses[i];
  }
  ASSERT_EQ(got.weights.size(), ref.weights.size());
  for (const auto& [name, w] : ref.weights) {
    ASSERT_TRUE(got.weights.count(name)) << name;
    const double rel = testing::rel_diff(got.weights.at(name), w);
    worst_weight = std::max(worst_weight, rel);
    // Note [Half-precision contract]: in bf16 the yardstick is how far
    // bf16 training lies from f32 training, parameter by parameter.
    const double tol = half ? std::max(weight_tol * testing::rel_diff(w, ref32.weights.at(name)), 2 * u) : weight_tol;
    EXPECT_LE(rel, tol) << name;
  }
  if (world()->rank() == 0) {
    std::printf("[contract] %s %s: %d steps, loss %.6f -> %.6f, worst loss diff %.2e, worst weight diff %.2e\n",
                layout.name.c_str(), c10::toString(dtype), kSteps, ref.losses.front(), ref.losses.back(), worst_loss,
                worst_weight);
  }
}

// Note [Dropout RNG rule] in a whole model: with dropout everywhere, the
// hidden states between blocks — replicated over TP — stay bit-identical on
// every TP rank; under sequence parallelism the ranks' slices draw different
// masks.
TEST(GPTDropout, FollowsTheRngRule) {
  const Layout layout = layout_from_env();
  ASSERT_EQ(layout.dp * layout.tp, world()->size());
  GPTConfig config = GPTConfig::tiny();
  config.dropout = 0.3;
  config.attention_dropout = 0.3;
  config.sequence_parallel = layout.sp;
  const auto& groups = testing::mesh_groups(layout.dp, layout.tp);
  GPT model(config, groups);
  model.train();
  at::Tensor tokens = batch(config, 0).narrow(1, 0, config.max_seq_len).contiguous();
  at::Tensor x = model.embedding()->forward(tokens);
  at::Tensor embedded = x.detach().clone();
  for (const auto& block : model.blocks()) x = block->forward(x);
  at::Tensor hidden = x.detach();
  if (layout.tp == 1) return;
  const auto& tp = groups.tp;
  at::Tensor all_hidden = tp::all_gather_along(hidden.unsqueeze(0).contiguous(), 0, tp);
  at::Tensor all_embedded = tp::all_gather_along(embedded.unsqueeze(0).contiguous(), 0, tp);
  for (int q = 0; q < layout.tp; ++q) {
    if (!layout.sp) {
      EXPECT_TRUE(at::equal(all_hidden[q], hidden)) << "replicated hidden states differ on TP rank " << q;
    } else if (q != tp->rank()) {
      // Same shape, independent masks: the dropped positions differ.
      EXPECT_FALSE(at::equal(all_embedded[q].eq(0), embedded.eq(0)))
          << "TP ranks " << q << " and " << tp->rank() << " drew the same sequence-parallel mask";
    }
  }
}

TEST(GPTContract, Float32) {
  check_contract(at::kFloat, 1e-5, 1e-4);
}
TEST(GPTContract, Float64) {
  check_contract(at::kDouble, 1e-10, 1e-10);
}
// Note [Half-precision contract]: the layouts train bf16 parameters with
// bf16 activations (AdamW in bf16, no master weights: what is compared is
// the model arithmetic, not an optimizer). They differ from one process
// only in where reductions round: a TP all-reduce or reduce-scatter rounds
// partial sums, DP averages rounded gradients, SP sums LayerNorm gradients
// of sequence slices — each a relative change of at most u = 2^-8 in one
// operand. Per step, the loss is an fp32 mean over 192 tokens of losses whose
// logits moved by a few u; over 20 steps we allow u/2 relative (measured:
// under u/10 on every registered layout). The weights are the harder
// measure: AdamW moves an element whose gradient is rounding noise by
// +-lr per step in either direction, so a few elements of a layout and of
// the single-process run part by several lr. That is exactly the kind of
// disagreement bf16 training has with f32 training, so each parameter's
// max-norm difference may be at most 4x bf16's own distance from f32 on that
// parameter (measured: under 3x), and at least 2u.
TEST(GPTContract, BFloat16) {
  constexpr double u = 1.0 / 256;
  check_contract(at::kBFloat16, u / 2, 4.0);
}

}  // namespace
}  // namespace torus::models
