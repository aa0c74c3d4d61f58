// The reference GPT in bf16 and f16 in one process, against the same model
// in f32 (same seed): the initial weights are the f32 ones rounded; the loss
// is fp32 and within the bound the logits' difference allows; every
// gradient comes back in the parameters' dtype and close to the f32 one;
// an f32 model under CPU autocast (bf16) trains to the same loss.
//
// Tolerances (u: unit roundoff, bf16 2^-8, f16 2^-11):
//  * the mean cross entropy is 1-Lipschitz in each token's logits in the
//    max norm on each side (d loss_t / d logits_t = softmax - onehot has
//    L1 norm <= 2), so |loss_half - loss_f32| <= 2 max|logits_half -
//    logits_f32| + fp32 noise: a bound computed from the run itself;
//  * logits, gradients: every layer rounds its inputs and outputs (a
//    relative error of u each) and the tiny model has ~10 such roundings on
//    any path from the input to the logits (embedding, 2 blocks of LayerNorm,
//    QKV, attention, projection, MLP, final LayerNorm and head), so 16 u
//    relative to the largest magnitude; gradients take the same path back
//    and get 32 u.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "parallel/parallel_test_util.h"
#include "torus/amp/autocast.h"
#include "torus/amp/grad_scaling.h"
#include "torus/amp/loss_scaler.h"
#include "torus/models/gpt.h"

namespace torus::models {
namespace {

using testing::rel_diff;
using testing::same_tokens;

double unit_roundoff(at::ScalarType t) { return t == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

struct Pass {
  at::Tensor logits, loss;
  std::map<std::string, at::Tensor> grads;
};

Pass forward_backward(GPT& model, bool autocast = false) {
  const GPTConfig& c = model.config();
  at::Tensor tokens = same_tokens({4, c.max_seq_len}, c.vocab_size, 7);
  at::Tensor labels = same_tokens({4, c.max_seq_len}, c.vocab_size, 8);
  Pass r;
  {
    std::optional<amp::AutocastGuard> guard;
    if (autocast) guard.emplace(c10::DeviceType::CPU, at::kBFloat16);
    r.logits = model.forward(tokens);
    r.loss = model.head()->loss(r.logits, labels);
  }
  r.loss.backward();
  for (const auto& p : model.named_parameters()) r.grads[p.key()] = p.value().grad();
  return r;
}

TEST(GPTHalf, InitialWeightsAreTheF32OnesRounded) {
  GPTConfig c = GPTConfig::tiny();
  GPT f32(c);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    c.dtype = dt;
    GPT half(c);
    auto ref = f32.named_parameters();
    for (const auto& p : half.named_parameters()) {
      EXPECT_EQ(p.value().scalar_type(), dt) << p.key();
      EXPECT_TRUE(at::equal(p.value(), ref[p.key()].to(dt))) << p.key();
    }
  }
}

TEST(GPTHalf, ForwardBackwardMatchesF32) {
  GPTConfig c = GPTConfig::tiny();
  GPT f32(c);
  const Pass ref = forward_backward(f32);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    const double u = unit_roundoff(dt);
    c.dtype = dt;
    GPT half(c);
    const Pass got = forward_backward(half);
    EXPECT_EQ(got.logits.scalar_type(), dt);
    EXPECT_EQ(got.loss.scalar_type(), at::kFloat) << "the loss must be fp32 whatever the parameters";
    const double logit_diff = (got.logits.to(at::kDouble) - ref.logits.to(at::kDouble)).abs().max().item<double>();
    const double loss_diff = std::abs(got.loss.item<double>() - ref.loss.item<double>());
    EXPECT_LE(rel_diff(got.logits, ref.logits), 16 * u);
    EXPECT_LE(loss_diff, 2 * logit_diff + 1e-6);
    double worst = 0;
    for (const auto& [name, g] : got.grads) {
      ASSERT_TRUE(g.defined()) << name;
      EXPECT_EQ(g.scalar_type(), dt) << name;
      const double d = rel_diff(g, ref.grads.at(name));
      worst = std::max(worst, d);
      EXPECT_LE(d, 32 * u) << name;
    }
    std::printf("[gpt half] %s: loss %.6f vs f32 %.6f (|diff| %.2e <= 2 max|logit diff| = %.2e), logits rel %.2e, "
                "worst gradient rel %.2e (u = %.2e)\n",
                c10::toString(dt), got.loss.item<double>(), ref.loss.item<double>(), loss_diff, 2 * logit_diff,
                rel_diff(got.logits, ref.logits), worst, u);
  }
}

TEST(GPTHalf, F32ModelUnderCpuAutocastMatchesF32) {
  GPTConfig c = GPTConfig::tiny();
  GPT plain(c), autocast(c);
  const Pass ref = forward_backward(plain);
  const Pass got = forward_backward(autocast, /*autocast=*/true);
  const double u = unit_roundoff(at::kBFloat16);
  EXPECT_EQ(got.loss.scalar_type(), at::kFloat);
  const double logit_diff = (got.logits.to(at::kDouble) - ref.logits.to(at::kDouble)).abs().max().item<double>();
  EXPECT_LE(rel_diff(got.logits, ref.logits), 16 * u);
  EXPECT_LE(std::abs(got.loss.item<double>() - ref.loss.item<double>()), 2 * logit_diff + 1e-6);
  double worst = 0;
  for (const auto& [name, g] : got.grads) {
    EXPECT_EQ(g.scalar_type(), at::kFloat) << name;  // fp32 parameters keep fp32 gradients
    const double d = rel_diff(g, ref.grads.at(name));
    worst = std::max(worst, d);
    EXPECT_LE(d, 32 * u) << name;
  }
  std::printf("[gpt autocast bf16] loss %.6f vs f32 %.6f, logits rel %.2e, worst gradient rel %.2e\n",
              got.loss.item<double>(), ref.loss.item<double>(), rel_diff(got.logits, ref.logits), worst);
}

// With attention dropout the block takes the explicit path (scores and
// softmax upcast, Note [Attention softmax in fp32]): it runs in bf16/f16 with
// an fp32 loss and finite gradients in the parameters' dtype. With the
// dropout draws identical across dtypes this would compare; they are not
// (the masks are drawn in the activations' dtype), so this checks the path.
TEST(GPTHalf, ExplicitAttentionPathRunsInHalfPrecision) {
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    GPTConfig c = GPTConfig::tiny();
    c.dtype = dt;
    c.attention_dropout = 0.1;
    GPT model(c);
    model.train();
    const Pass r = forward_backward(model);
    EXPECT_EQ(r.loss.scalar_type(), at::kFloat);
    EXPECT_TRUE(std::isfinite(r.loss.item<double>()));
    EXPECT_NEAR(r.loss.item<double>(), std::log(static_cast<double>(c.vocab_size)), 0.3);
    for (const auto& [name, g] : r.grads) {
      ASSERT_TRUE(g.defined()) << name;
      EXPECT_EQ(g.scalar_type(), dt) << name;
      EXPECT_TRUE(at::isfinite(g).all().item<bool>()) << name;
    }
  }
}

// fp16 training with the dynamic loss scaler: a start at 2^24 overflows the
// fp16 logit gradients (S / 64 tokens > 65504), so the first steps are
// skipped with the parameters untouched and the scale halved each time;
// once S fits, steps are taken, the scale grows after each interval (and
// backs off again when a grown scale overflows), and the model learns.
TEST(GPTHalf, Fp16TrainsWithTheDynamicLossScaler) {
  GPTConfig c = GPTConfig::tiny();
  c.dtype = at::kHalf;
  GPT model(c);
  amp::LossScaler scaler({.initial_scale = std::ldexp(1.0, 24), .growth_interval = 4});
  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.5));
  at::Tensor data = same_tokens({4, c.max_seq_len + 1}, c.vocab_size, 11);
  for (int64_t i = 1; i < data.size(1); ++i)
    data.select(1, i).copy_((data.select(1, i - 1) * 3 + 7) % c.vocab_size);
  at::Tensor tokens = data.narrow(1, 0, c.max_seq_len).contiguous(), labels = data.narrow(1, 1, c.max_seq_len).contiguous();
  std::vector<double> losses;
  int skipped_at_start = 0;
  bool taken_any = false;
  for (int step = 0; step < 20; ++step) {
    const double scale = scaler.scale();
    at::Tensor loss = model.loss(tokens, labels);
    ASSERT_EQ(loss.scalar_type(), at::kFloat);
    scaler.scale_loss(loss).backward();
    std::vector<at::Tensor> grads = amp::grads_of(model.parameters());
    const bool inf = amp::found_non_finite(grads, nullptr);
    // Sufficient for an overflow: a logit gradient S (softmax - onehot) / 64
    // tokens beyond fp16's 65504 (other gradients may overflow earlier).
    if (scale / (4 * c.max_seq_len) > 65504) EXPECT_TRUE(inf) << "step " << step << " scale " << scale;
    const at::Tensor before = model.parameters()[0].detach().clone();
    if (!inf) {
      amp::unscale_(grads, scaler.inv_scale());
      opt.step();
      taken_any = true;
      losses.push_back(loss.item<double>());
    } else {
      if (!taken_any) ++skipped_at_start;
      EXPECT_TRUE(at::equal(model.parameters()[0], before));
    }
    EXPECT_EQ(scaler.update(inf), !inf);
    EXPECT_EQ(scaler.scale(), inf ? scale / 2 : (scaler.clean_steps_since_growth() == 0 ? 2 * scale : scale));
    opt.zero_grad();
  }
  // 2^24 / 64 = 2^18 > 65504: at least the first two steps (2^24, 2^23) overflow.
  EXPECT_GE(skipped_at_start, 2);
  EXPECT_GE(scaler.growth_count(), 1);
  ASSERT_FALSE(losses.empty());
  EXPECT_LT(losses.back(), losses.front() - 0.5) << "fp16 training did not learn";
  std::printf("[gpt fp16 + loss scaler] %zu steps taken, %lld skipped, final scale 2^%g, loss %.4f -> %.4f\n",
              losses.size(), static_cast<long long>(scaler.skipped_steps()), std::log2(scaler.scale()), losses.front(),
              losses.back());
}

}  // namespace
}  // namespace torus::models
