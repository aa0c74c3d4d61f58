// The engine with half precision and its state, under mpirun:
//  * FP16 overflow injected on ONE rank of tp2 x pp2 x dp2 (8 ranks): every
//    rank skips that step, the loss scale halves, parameters and optimizer
//    state (step count included) are bit-identical to before the step; a
//    few clean steps later (growth interval 3) the scale grows back.
//  * BF16 and FP16 training of the GPT track f32 over 200 steps (1 rank).
//  * state_dict / load_state_dict: a fresh trainer loaded with another's
//    state continues bit-identically; bad states are refused first.
// Each case needs its world size (8: overflow; 1: tracking; 2: state);
// tests.cmake runs each one under its own mpirun with --gtest_filter.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "parallel/parallel_test_util.h"
#include "torus/core/error.h"
#include "torus/models/gpt.h"
#include "torus/engine/gpt_model.h"
#include "train/engine_test_util.h"

namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

using testing::world;

using testing_util::small_gpt;

at::Tensor batch_of(int64_t step, int64_t rows, int64_t seq) { return testing_util::batch_of(step, rows, seq, 99); }

StateDict snapshot(const Trainer& t) {
  StateDict s = t.state_dict();
  for (auto& [k, v] : s) v.tensor = v.tensor.clone();
  return s;
}

void expect_bit_identical(const StateDict& a, const StateDict& b, const std::string& prefix) {
  int compared = 0;
  for (const auto& [key, t] : a) {
    if (key.rfind(prefix, 0) != 0) continue;
    auto it = b.find(key);
    ASSERT_NE(it, b.end()) << key;
    EXPECT_TRUE(at::equal(t.tensor, it->second.tensor)) << key << " changed";
    ++compared;
  }
  EXPECT_GT(compared, 0) << prefix;
}

TEST(Fp16Overflow, OneRankOverflowsEveryRankSkips) {
  ASSERT_EQ(world()->size(), 8) << "run under mpirun -np 8 (tp2 x pp2 x dp2)";
  ParallelLayout layout;
  layout.tp = 2;
  layout.pp = 2;
  layout.dp = 2;
  layout.num_micro = 2;
  TrainerOptions options;
  options.loss_scaler.initial_scale = 1024;  // far from fp16 overflow on this model
  options.loss_scaler.growth_interval = 3;
  options.inject_overflow_rank = 5;
  options.inject_overflow_step = 3;
  OptimizerConfig optim;
  optim.lr = 1e-3;
  GPTTrainer trainer(world(), small_gpt(at::kHalf), layout, optim, options);
  const int64_t rows = 8, seq = 32;
  for (int64_t k = 0; k < 2; ++k) {
    const StepStats st = trainer.train_step(batch_of(k, rows, seq));
    ASSERT_FALSE(st.skipped) << "step " << st.step << " overflowed naturally at scale " << st.loss_scale;
    EXPECT_DOUBLE_EQ(st.loss_scale, 1024);
  }
  const StateDict before = snapshot(trainer);
  const StepStats bad = trainer.train_step(batch_of(2, rows, seq));
  EXPECT_TRUE(bad.overflow);
  EXPECT_TRUE(bad.skipped);
  EXPECT_EQ(bad.skipped_steps, 1);
  EXPECT_DOUBLE_EQ(bad.loss_scale, 1024);
  const StateDict after = trainer.state_dict();
  expect_bit_identical(before, after, "model.");
  expect_bit_identical(before, after, "optim.");  // every state tensor and the optimizer's step count
  EXPECT_DOUBLE_EQ(after.at("scaler.scale").tensor.item<double>(), 512);
  // Clean steps at the halved scale; after 3 of them the scale doubles.
  double scale = 0;
  for (int64_t k = 3; k < 6; ++k) {
    const StepStats st = trainer.train_step(batch_of(k, rows, seq));
    EXPECT_FALSE(st.skipped) << "step " << st.step;
    EXPECT_DOUBLE_EQ(st.loss_scale, 512);
    EXPECT_TRUE(std::isfinite(st.loss));
  }
  scale = trainer.state_dict().at("scaler.scale").tensor.item<double>();
  EXPECT_DOUBLE_EQ(scale, 1024);
  EXPECT_EQ(trainer.state_dict().at("optim.step_count").tensor.item<int64_t>(), 5);  // 6 calls, 1 skipped
}

// Loss curves of 200 steps, one rank, same batches and initialisation.
std::vector<double> curve(c10::ScalarType dtype, int64_t steps) {
  ParallelLayout layout;
  OptimizerConfig optim;
  optim.lr = 3e-3;
  GPTTrainer trainer(world(), small_gpt(dtype), layout, optim);
  std::vector<double> out;
  for (int64_t k = 0; k < steps; ++k) out.push_back(trainer.train_step(batch_of(k, 8, 32)).loss);
  return out;
}

// Mean of losses [b, e).
double mean(const std::vector<double>& v, size_t b, size_t e) {
  double s = 0;
  for (size_t i = b; i < e; ++i) s += v[i];
  return s / static_cast<double>(e - b);
}

TEST(HalfPrecision, Bf16AndFp16TrackF32Over200Steps) {
  ASSERT_EQ(world()->size(), 1) << "run on one rank";
  const int64_t steps = 200;
  const std::vector<double> f32 = curve(at::kFloat, steps);
  // The loss must fall for the comparison to mean anything.
  ASSERT_LT(mean(f32, 180, 200), mean(f32, 0, 20) - 1.0);
  // Tolerance. The weights are f32 masters in every run; the half runs
  // differ by rounding activations and weights to 8 (bf16) or 11 (f16)
  // significant bits in the forward and backward, which changes each step's
  // update slightly and from then on the optimizer's trajectory. The first
  // loss (the same initial weights, rounded) agrees to 1% (about 2^-9 x 20
  // operations deep x the loss). The curves, averaged over windows of 20
  // steps (batch noise), stay within a band of the f32 curve: 0.15 nats for
  // bf16 and 0.3 nats for f16 at every window, and their last windows
  // within 3% (bf16) and 8% (f16) of f32. Measured on this model (1 and 2
  // threads): bf16 at most 0.093 nats off and 1.5% at the end; f16 lags
  // more (0.21 nats, 5.8% in the last window, with no skipped step) — more
  // than its finer rounding suggests; the cause is not known yet (the CPU's
  // f16 matmul and attention kernels are the first suspects), so the f16
  // band is the measured lag with a margin, not a bound derived from u.
  struct Band {
    c10::ScalarType dtype;
    double window, final_fraction;
  };
  for (const Band& band : {Band{at::kBFloat16, 0.15, 0.03}, Band{at::kHalf, 0.3, 0.08}}) {
    const std::vector<double> half = curve(band.dtype, steps);
    const char* name = c10::toString(band.dtype);
    EXPECT_NEAR(half[0], f32[0], 0.01 * f32[0]) << name;
    double worst = 0;
    for (size_t w = 0; w + 20 <= static_cast<size_t>(steps); w += 20) {
      worst = std::max(worst, std::fabs(mean(half, w, w + 20) - mean(f32, w, w + 20)));
    }
    std::printf("[half precision] %s: first loss %.4f (f32 %.4f), worst 20-step window %.4f nats, last window %.4f "
                "(f32 %.4f)\n",
                name, half[0], f32[0], worst, mean(half, 180, 200), mean(f32, 180, 200));
    for (size_t w = 0; w + 20 <= static_cast<size_t>(steps); w += 20) {
      EXPECT_NEAR(mean(half, w, w + 20), mean(f32, w, w + 20), band.window) << name << " window " << w;
    }
    EXPECT_NEAR(mean(half, 180, 200), mean(f32, 180, 200), band.final_fraction * mean(f32, 180, 200)) << name;
    // Both learn: the last window is far below the first.
    EXPECT_LT(mean(half, 180, 200), mean(half, 0, 20) - 1.0) << name;
  }
}

TEST(EngineState, LoadedTrainerContinuesIdentically) {
  ASSERT_EQ(world()->size(), 2) << "run under mpirun -np 2 (pp2)";
  ParallelLayout layout;
  layout.pp = 2;
  layout.num_micro = 2;
  models::GPTConfig cfg = small_gpt(at::kFloat);
  cfg.dropout = 0.1;  // the dropout streams are state too
  OptimizerConfig optim;
  optim.lr = 1e-3;
  GPTTrainer a(world(), cfg, layout, optim);
  for (int64_t k = 0; k < 3; ++k) a.train_step(batch_of(k, 4, 32));
  const StateDict saved = snapshot(a);
  EXPECT_TRUE(saved.count("engine.step"));
  EXPECT_TRUE(saved.count("optim.step_count"));
  // A parameter's optimizer state carries its shard spec.
  bool has_state = false;
  for (const auto& [key, t] : saved) has_state |= key.rfind("optim.", 0) == 0 && key.find("exp_avg") != std::string::npos;
  EXPECT_TRUE(has_state);

  GPTTrainer b(world(), cfg, layout, optim);
  b.load_state_dict(saved);
  EXPECT_EQ(b.steps_taken(), 3);
  for (int64_t k = 3; k < 5; ++k) {
    const double la = a.train_step(batch_of(k, 4, 32)).loss;
    const double lb = b.train_step(batch_of(k, 4, 32)).loss;
    EXPECT_EQ(la, lb) << "step " << k;
  }
  expect_bit_identical(a.state_dict(), b.state_dict(), "model.");
  expect_bit_identical(a.state_dict(), b.state_dict(), "optim.");

  // Refused before anything changes: a wrong shape, a missing key.
  const StateDict good = snapshot(b);
  StateDict wrong = snapshot(b);
  auto it = wrong.begin();
  while (it->first.rfind("model.", 0) != 0) ++it;
  it->second.tensor = at::zeros({3}, it->second.tensor.options());
  EXPECT_THROW(b.load_state_dict(wrong), InvalidArgument);
  StateDict missing = snapshot(b);
  missing.erase("engine.step");
  EXPECT_THROW(b.load_state_dict(missing), InvalidArgument);
  expect_bit_identical(good, b.state_dict(), "model.");
}

}  // namespace
}  // namespace torus::train_test
