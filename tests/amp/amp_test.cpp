// Mixed-precision building blocks: precision names, the dynamic loss scaler
// (growth, backoff, hysteresis, the min-scale error, state round trip, the
// static mode), unscale_, the autocast scope, and found_non_finite() across
// ranks — on 1-4 ranks, with the inf/NaN on ONE rank only, every rank must
// see it.
//
// Expected scales are computed from the rules (Note [Dynamic loss scale
// rules]) step by step alongside the scaler, never stored.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "parallel/parallel_test_util.h"
#include "torus/amp/autocast.h"
#include "torus/amp/grad_scaling.h"
#include "torus/amp/loss_scaler.h"
#include "torus/amp/precision.h"

namespace torus::amp {
namespace {

using testing::mesh_groups;
using testing::world;

TEST(Precision, ParsesEverySpellingAndRoundTrips) {
  for (const char* s : {"f32", "fp32", "float32", "F32"}) EXPECT_EQ(parse_precision(s), Precision::kF32) << s;
  for (const char* s : {"bf16", "bfloat16", "BF16"}) EXPECT_EQ(parse_precision(s), Precision::kBF16) << s;
  for (const char* s : {"fp16", "f16", "float16"}) EXPECT_EQ(parse_precision(s), Precision::kF16) << s;
  for (Precision p : {Precision::kF32, Precision::kBF16, Precision::kF16}) {
    EXPECT_EQ(parse_precision(precision_name(p)), p);
    EXPECT_EQ(precision_of(param_dtype(p)), p);
  }
  EXPECT_EQ(param_dtype(Precision::kBF16), at::kBFloat16);
  EXPECT_EQ(param_dtype(Precision::kF16), at::kHalf);
  EXPECT_TRUE(needs_loss_scaling(Precision::kF16));
  EXPECT_FALSE(needs_loss_scaling(Precision::kBF16));
  EXPECT_THROW(parse_precision("fp8"), InvalidArgument);
  EXPECT_THROW(parse_precision(""), InvalidArgument);
  EXPECT_THROW(precision_of(at::kLong), InvalidArgument);
}

TEST(LossScaler, DefaultsAreTheDocumentedOnes) {
  LossScaler s;
  EXPECT_EQ(s.scale(), std::ldexp(1.0, 16));
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_EQ(s.options().hysteresis, 1);
  EXPECT_EQ(s.options().min_scale, 1.0);
  EXPECT_TRUE(s.dynamic());
}

TEST(LossScaler, GrowsAfterTheIntervalAndBacksOffOnOverflow) {
  LossScalerOptions o;
  o.initial_scale = 1024;
  o.growth_interval = 3;
  LossScaler s(o);
  double expect = 1024;
  // Three clean steps: grows once, on the third.
  for (int i = 1; i <= 3; ++i) {
    EXPECT_TRUE(s.update(false));
    if (i == 3) expect *= 2;
    EXPECT_EQ(s.scale(), expect) << "clean step " << i;
  }
  EXPECT_EQ(s.growth_count(), 1);
  // Two clean steps, an overflow (halves, resets the count), then the next
  // growth needs three fresh clean steps.
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));
  expect /= 2;
  EXPECT_EQ(s.scale(), expect);
  EXPECT_EQ(s.clean_steps_since_growth(), 0);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), expect);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 2 * expect);
  EXPECT_EQ(s.steps(), 9);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.backoff_count(), 1);
  EXPECT_EQ(s.growth_count(), 2);
  // scale_loss multiplies by the current scale.
  at::Tensor loss = at::full({}, 0.75, at::TensorOptions().dtype(at::kFloat));
  EXPECT_EQ(s.scale_loss(loss).item<double>(), 0.75 * s.scale());
}

TEST(LossScaler, MaxScaleBoundsGrowth) {
  LossScalerOptions o;
  o.initial_scale = 4;
  o.max_scale = 6;
  o.growth_interval = 1;
  LossScaler s(o);
  s.update(false);
  EXPECT_EQ(s.scale(), 6);
  s.update(false);
  EXPECT_EQ(s.scale(), 6);
  EXPECT_EQ(s.growth_count(), 1);
}

TEST(LossScaler, HysteresisToleratesOverflowsUntilTheNextGrowth) {
  LossScalerOptions o;
  o.initial_scale = 256;
  o.growth_interval = 2;
  o.hysteresis = 3;
  LossScaler s(o);
  // Overflows 1 and 2 are tolerated (steps skipped, scale kept); the third
  // backs off, and so does every further one until a growth refills the budget.
  EXPECT_FALSE(s.update(true));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.hysteresis_left(), 1);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 128);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 64);
  // A clean step alone does not refill it ...
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 32);
  // ... a growth does.
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 64);
  EXPECT_EQ(s.hysteresis_left(), 3);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 64);
  EXPECT_EQ(s.skipped_steps(), 6);
}

TEST(LossScaler, AnOverflowAtTheMinimumScaleThrowsNamingStepAndScale) {
  LossScalerOptions o;
  o.initial_scale = 4;
  o.min_scale = 1;
  LossScaler s(o);
  EXPECT_FALSE(s.update(true));  // 4 -> 2
  EXPECT_FALSE(s.update(true));  // 2 -> 1: reaches the minimum, no error yet
  EXPECT_EQ(s.scale(), 1);
  try {
    s.update(true);  // step 3, at the minimum
    FAIL() << "no error at the minimum scale";
  } catch (const InvalidArgument&) {
    FAIL() << "expected torus::Error, not InvalidArgument";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("step 3"), std::string::npos) << what;
    EXPECT_NE(what.find("minimum 1"), std::string::npos) << what;
  }
  // A floor that is not a power of two of the start is still reached exactly.
  LossScalerOptions odd;
  odd.initial_scale = 10;
  odd.min_scale = 3;
  LossScaler t(odd);
  t.update(true);
  EXPECT_EQ(t.scale(), 5);
  t.update(true);
  EXPECT_EQ(t.scale(), 3);
  EXPECT_THROW(t.update(true), Error);
}

TEST(LossScaler, StaticModeNeverMovesButReportsSkippedSteps) {
  LossScaler s = LossScaler::constant(128);
  EXPECT_FALSE(s.dynamic());
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.skipped_steps(), 2);
  EXPECT_EQ(s.growth_count(), 0);
  LossScaler one = LossScaler::constant();
  at::Tensor loss = at::ones({}, at::TensorOptions().dtype(at::kFloat));
  EXPECT_TRUE(one.scale_loss(loss).is_same(loss));  // the identity costs nothing
  EXPECT_THROW(LossScaler::constant(0), InvalidArgument);
}

TEST(LossScaler, StateRoundTripsAndBadStateIsRefused) {
  LossScalerOptions o;
  o.initial_scale = 512;
  o.growth_interval = 4;
  o.hysteresis = 2;
  LossScaler a(o);
  for (bool inf : {false, false, true, true, false, false, false}) a.update(inf);
  const auto state = a.state_dict();
  LossScaler b(o);
  b.load_state_dict(state);
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.steps(), a.steps());
  EXPECT_EQ(b.skipped_steps(), a.skipped_steps());
  EXPECT_EQ(b.growth_count(), a.growth_count());
  EXPECT_EQ(b.backoff_count(), a.backoff_count());
  EXPECT_EQ(b.clean_steps_since_growth(), a.clean_steps_since_growth());
  EXPECT_EQ(b.hysteresis_left(), a.hysteresis_left());
  // Both continue identically.
  for (bool inf : {false, true, false, false, false, false, true, true}) {
    EXPECT_EQ(a.update(inf), b.update(inf));
    EXPECT_EQ(a.scale(), b.scale());
  }
  auto missing = state;
  missing.erase("scale");
  EXPECT_THROW(b.load_state_dict(missing), InvalidArgument);
  auto bad = state;
  bad["scale"] = at::scalar_tensor(-1.0, at::TensorOptions().dtype(at::kDouble));
  const double before = b.scale();
  EXPECT_THROW(b.load_state_dict(bad), InvalidArgument);
  EXPECT_EQ(b.scale(), before) << "a refused state changed the scaler";
  bad = state;
  bad["growth_tracker"] = at::scalar_tensor(int64_t{4}, at::TensorOptions().dtype(at::kLong));
  EXPECT_THROW(b.load_state_dict(bad), InvalidArgument);
  bad = state;
  bad["steps"] = at::zeros({2}, at::TensorOptions().dtype(at::kLong));
  EXPECT_THROW(b.load_state_dict(bad), InvalidArgument);
}

TEST(LossScaler, OptionsAreValidated) {
  auto with = [](auto edit) {
    LossScalerOptions o;
    edit(o);
    return o;
  };
  EXPECT_THROW(LossScaler(with([](auto& o) { o.growth_interval = 0; })), InvalidArgument);
  EXPECT_THROW(LossScaler(with([](auto& o) { o.hysteresis = 0; })), InvalidArgument);
  EXPECT_THROW(LossScaler(with([](auto& o) { o.growth_factor = 1; })), InvalidArgument);
  EXPECT_THROW(LossScaler(with([](auto& o) { o.backoff_factor = 1; })), InvalidArgument);
  EXPECT_THROW(LossScaler(with([](auto& o) { o.backoff_factor = 0; })), InvalidArgument);
  EXPECT_THROW(LossScaler(with([](auto& o) { o.min_scale = 0; })), InvalidArgument);
  EXPECT_THROW(LossScaler(with([](auto& o) { o.max_scale = 0.5; })), InvalidArgument);
  EXPECT_THROW(LossScaler(with([](auto& o) { o.initial_scale = 1e30; })), InvalidArgument);
  EXPECT_THROW(LossScaler(with([](auto& o) { o.initial_scale = std::numeric_limits<double>::quiet_NaN(); })),
               InvalidArgument);
}

TEST(Unscale, MultipliesInPlaceInEachDtype) {
  at::Tensor f32 = testing::same_randn({7, 3}, 1).mul_(1024);
  at::Tensor bf16 = testing::same_randn({5}, 2).mul_(1024).to(at::kBFloat16);
  at::Tensor f16 = testing::same_randn({4, 2}, 3).mul_(1024).to(at::kHalf);
  const at::Tensor f32_0 = f32.clone(), bf16_0 = bf16.clone(), f16_0 = f16.clone();
  unscale_({f32, at::Tensor(), bf16, f16}, 1.0 / 1024);
  // A power of two: exact in every dtype.
  EXPECT_TRUE(at::equal(f32, f32_0 / 1024));
  EXPECT_TRUE(at::equal(bf16, (bf16_0.to(at::kFloat) / 1024).to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(f16, (f16_0.to(at::kFloat) / 1024).to(at::kHalf)));
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  // Otherwise rounded once from the fp32 product.
  at::Tensor h = f16_0.clone();
  unscale_({h}, 0.3);
  at::Tensor want = (f16_0.to(at::kFloat) * 0.3).to(at::kHalf);
  EXPECT_TRUE(at::equal(h, want)) << h.ne(want).sum().item<int64_t>() << " of " << h.numel() << " differ";
  EXPECT_THROW(unscale_({h}, 0.0), InvalidArgument);
  EXPECT_THROW(unscale_({h}, std::numeric_limits<double>::infinity()), InvalidArgument);
}

TEST(Autocast, GuardScopesAndRestoresTheState) {
  const auto cpu = c10::DeviceType::CPU;
  const bool was = at::autocast::is_autocast_enabled(cpu);
  const auto dtype = at::autocast::get_autocast_dtype(cpu);
  at::Tensor a = testing::same_randn({4, 8}, 1), b = testing::same_randn({8, 3}, 2);
  {
    AutocastGuard guard(cpu, at::kBFloat16);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(cpu));
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
    {
      AutocastGuard off(cpu, at::kBFloat16, /*enabled=*/false);
      EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
    }
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(at::autocast::is_autocast_enabled(cpu), was);
  EXPECT_EQ(at::autocast::get_autocast_dtype(cpu), dtype);
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  EXPECT_THROW(AutocastGuard(cpu, at::kFloat), InvalidArgument);
  EXPECT_THROW(AutocastGuard(c10::DeviceType::Meta, at::kBFloat16), InvalidArgument);
}

// --- found_non_finite across ranks -------------------------------------------------

// Gradients of this rank: finite, except on `bad_rank`, whose second tensor
// gets `poison` at one element.
std::vector<at::Tensor> grads_for(int rank, int bad_rank, double poison, at::ScalarType dtype) {
  std::vector<at::Tensor> g{testing::same_randn({6, 5}, 10 + rank).to(dtype), at::Tensor(),
                            testing::same_randn({17}, 20 + rank).to(dtype)};
  if (rank == bad_rank) g[2][11] = poison;
  return g;
}

TEST(FoundNonFinite, OneRanksInfOrNanIsSeenByEveryRank) {
  const auto& w = world();
  const int n = w->size(), r = w->rank();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (double poison : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                          std::numeric_limits<double>::quiet_NaN()}) {
      for (int bad = 0; bad < n; ++bad) {
        SCOPED_TRACE(fmt::format("{} poison {} on rank {} of {}", c10::toString(dtype), poison, bad, n));
        EXPECT_TRUE(found_non_finite(grads_for(r, bad, poison, dtype), w));
      }
    }
    // Nobody poisoned: false everywhere. Large finite values (whose sum would
    // overflow) are not a false alarm.
    EXPECT_FALSE(found_non_finite(grads_for(r, -1, 0, dtype), w));
    at::Tensor big = at::full({64}, dtype == at::kHalf ? 60000.0 : 3e38, at::TensorOptions().dtype(dtype));
    EXPECT_FALSE(found_non_finite({big}, w));
  }
}

TEST(FoundNonFinite, EveryGroupOfALayoutCarriesTheVerdict) {
  const auto& w = world();
  const int n = w->size(), r = w->rank();
  // dp x tp2 where the world divides, else dp x tp1 (a TP group of one rank
  // is skipped by the check: only the rank itself then sees its inf over tp).
  const int tp = n % 2 == 0 ? 2 : 1;
  const auto& groups = mesh_groups(n / tp, tp);
  for (int bad = 0; bad < n; ++bad) {
    SCOPED_TRACE(fmt::format("inf on rank {} of {}", bad, n));
    const auto g = grads_for(r, bad, std::numeric_limits<double>::infinity(), at::kFloat);
    // Over tp then dp (and a null group, skipped): global.
    EXPECT_TRUE(found_non_finite(g, {groups.tp, nullptr, groups.dp}));
    // Over one group spanning both: global too.
    EXPECT_TRUE(found_non_finite(g, groups.dp_tp));
    // Over tp alone: only the poisoned rank's TP group knows — proof that the
    // verdict travels over exactly the groups given.
    const bool same_tp_group = bad / tp == r / tp;
    EXPECT_EQ(found_non_finite(g, groups.tp), same_tp_group);
  }
}

TEST(FoundNonFinite, ARankWithoutGradientsStillTakesPart) {
  const auto& w = world();
  const int r = w->rank(), n = w->size();
  // Rank 0 holds no gradients (a stage without parameters); the last rank an inf.
  std::vector<at::Tensor> g = r == 0 ? std::vector<at::Tensor>{} : grads_for(r, n - 1, std::numeric_limits<double>::infinity(), at::kFloat);
  EXPECT_EQ(found_non_finite(g, w, c10::Device(c10::kCPU)), n > 1);  // one rank: rank 0 is the gradient-less one
  EXPECT_FALSE(found_non_finite({}, w));
  EXPECT_THROW(found_non_finite({at::zeros({2}, at::TensorOptions().dtype(at::kLong))}, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace torus::amp
