// optim::clip_grad_norm over a group of 2+ ranks (host backend): the global
// norm in closed form, and a non-finite gradient on ONE rank reported as
// non-finite on every rank, with no gradient scaled anywhere.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "torus/comm/process_group.h"
#include "torus/optim/clip.h"

namespace torus::optim {
namespace {

const comm::ProcessGroupPtr& world() {
  static comm::ProcessGroupPtr w = torus::init();
  return w;
}

TEST(ClipGradNormMultiRank, NormSumsEveryRanksSquares) {
  const int n = world()->size(), r = world()->rank();
  // Rank r holds 3 elements of value r + 1: norm^2 = 3 sum (r+1)^2 = n(n+1)(2n+1)/2.
  at::Tensor g = at::full({3}, static_cast<double>(r + 1), at::kDouble);
  ClipResult res = clip_grad_norm({{.grad = g}}, 1.0, world());
  const double norm = std::sqrt(n * (n + 1) * (2 * n + 1) / 2.0);
  EXPECT_TRUE(res.finite);
  EXPECT_NEAR(res.norm, norm, 1e-12 * norm);
  EXPECT_NEAR(g[0].item<double>(), (r + 1) * 1.0 / (norm + 1e-6), 1e-12);
}

void one_rank_non_finite(float bad) {
  const int n = world()->size(), r = world()->rank();
  ASSERT_GE(n, 2);
  at::Tensor p = at::zeros({5}).requires_grad_();
  p.mutable_grad() = at::full({5}, 0.5f);
  if (r == n - 1) p.mutable_grad()[2] = bad;  // only the last rank
  const at::Tensor before = p.grad().clone();
  ClipResult res = clip_grad_norm({{p}}, 0.1, world());
  EXPECT_FALSE(res.finite) << "rank " << r;
  EXPECT_EQ(res.coefficient, 1.0);
  EXPECT_TRUE(at::equal(p.grad().isnan(), before.isnan()));
  EXPECT_TRUE(at::equal(p.grad().nan_to_num(0), before.nan_to_num(0))) << "rank " << r << ": a gradient was scaled";
}

TEST(ClipGradNormMultiRank, InfOnOneRankIsNonFiniteOnEveryRank) {
  one_rank_non_finite(std::numeric_limits<float>::infinity());
}

TEST(ClipGradNormMultiRank, NanOnOneRankIsNonFiniteOnEveryRank) {
  one_rank_non_finite(std::numeric_limits<float>::quiet_NaN());
}

TEST(ClipGradNormMultiRank, RanksWithoutGradientsStillTakePart) {
  const int r = world()->rank();
  at::Tensor g = at::full({4}, 1.0);
  std::vector<GradNormEntry> entries;
  if (r == 0) entries.push_back({.grad = g});  // |g| = 2, on rank 0 only
  ClipResult res = clip_grad_norm(entries, 0.0, world());
  EXPECT_DOUBLE_EQ(res.norm, 2.0);
}

}  // namespace
}  // namespace torus::optim
