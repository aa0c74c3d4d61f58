// LrSchedule against hand-computed values of its closed form: warm-up ramp,
// cosine decay endpoints and midpoint, the floor after the run, the corner
// cases W = 0, W = T - 1 and W = T, and validation errors.
#include "torus/run/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "torus/core/error.h"

namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

TEST(LrSchedule, WarmupThenCosineToMin) {
  // P = 1e-3, M = 1e-4, W = 10, T = 111, so the decay spans D = 100 steps.
  const LrSchedule s{.peak = 1e-3, .min = 1e-4, .warmup_steps = 10, .total_steps = 111};
  // Warm-up: P * (s + 1) / W.
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
  // Decay starts at the peak.
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  // Midpoint (s - W = 50 = D / 2): cos(pi / 2) = 0, so (P + M) / 2.
  EXPECT_NEAR(s.at(60), 5.5e-4, 1e-15);
  // A quarter in: cos(pi / 4) = sqrt(2) / 2 -> M + (P - M) * (1 + 0.70710678) / 2.
  EXPECT_NEAR(s.at(35), 1e-4 + 9e-4 * (1 + 0.7071067811865476) / 2, 1e-15);
  // Three quarters: M + (P - M) * (1 - 0.70710678) / 2.
  EXPECT_NEAR(s.at(85), 1e-4 + 9e-4 * (1 - 0.7071067811865476) / 2, 1e-15);
  // Reaches exactly M at T - 1, and stays there.
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(111), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(1000000), 1e-4);
  // Non-increasing over the decay, never below M.
  for (int64_t k = 11; k < 115; ++k) {
    EXPECT_LE(s.at(k), s.at(k - 1)) << k;
    EXPECT_GE(s.at(k), 1e-4) << k;
  }
}

TEST(LrSchedule, NoWarmup) {
  const LrSchedule s{.peak = 2.0, .min = 0.0, .warmup_steps = 0, .total_steps = 5};
  // D = 4: lr = (1 + cos(pi * s / 4)) with P = 2, M = 0.
  EXPECT_DOUBLE_EQ(s.at(0), 2.0);
  EXPECT_NEAR(s.at(1), 1 + 0.7071067811865476, 1e-15);
  EXPECT_NEAR(s.at(2), 1.0, 1e-15);
  EXPECT_NEAR(s.at(3), 1 - 0.7071067811865476, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(4), 0.0);
}

TEST(LrSchedule, CornerCases) {
  // W = T - 1: no decay span; step W is the peak, later steps the floor.
  const LrSchedule a{.peak = 1.0, .min = 0.25, .warmup_steps = 3, .total_steps = 4};
  EXPECT_DOUBLE_EQ(a.at(0), 1.0 / 3);
  EXPECT_DOUBLE_EQ(a.at(2), 1.0);
  EXPECT_DOUBLE_EQ(a.at(3), 1.0);
  EXPECT_DOUBLE_EQ(a.at(4), 0.25);
  // W = T: all warm-up.
  const LrSchedule b{.peak = 1.0, .min = 0.5, .warmup_steps = 4, .total_steps = 4};
  EXPECT_DOUBLE_EQ(b.at(0), 0.25);
  EXPECT_DOUBLE_EQ(b.at(3), 1.0);
  EXPECT_DOUBLE_EQ(b.at(4), 0.5);
  // One step, no warm-up: the peak.
  const LrSchedule c{.peak = 0.1, .min = 0.01, .warmup_steps = 0, .total_steps = 1};
  EXPECT_DOUBLE_EQ(c.at(0), 0.1);
  EXPECT_DOUBLE_EQ(c.at(1), 0.01);
  // peak == min: constant.
  const LrSchedule d{.peak = 0.3, .min = 0.3, .warmup_steps = 0, .total_steps = 10};
  for (int k = 0; k < 12; ++k) EXPECT_DOUBLE_EQ(d.at(k), 0.3);
}

TEST(LrSchedule, ValidationErrors) {
  auto bad = [](LrSchedule s) {
    EXPECT_THROW(s.validate(), InvalidArgument);
    EXPECT_THROW(s.at(0), InvalidArgument);
  };
  bad({.peak = -1, .min = 0, .warmup_steps = 0, .total_steps = 10});
  bad({.peak = 1, .min = -0.1, .warmup_steps = 0, .total_steps = 10});
  bad({.peak = 1, .min = 2, .warmup_steps = 0, .total_steps = 10});
  bad({.peak = NAN, .min = 0, .warmup_steps = 0, .total_steps = 10});
  bad({.peak = INFINITY, .min = 0, .warmup_steps = 0, .total_steps = 10});
  bad({.peak = 1, .min = 0, .warmup_steps = -1, .total_steps = 10});
  bad({.peak = 1, .min = 0, .warmup_steps = 11, .total_steps = 10});
  bad({.peak = 1, .min = 0, .warmup_steps = 0, .total_steps = 0});
  const LrSchedule ok{.peak = 1, .min = 0, .warmup_steps = 0, .total_steps = 10};
  EXPECT_NO_THROW(ok.validate());
  EXPECT_THROW(ok.at(-1), InvalidArgument);
  try {
    LrSchedule{.peak = 1, .min = 0, .warmup_steps = 12, .total_steps = 10}.validate();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("warmup_steps"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace torus::train_test
