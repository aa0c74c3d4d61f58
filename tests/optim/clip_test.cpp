// optim::clip_grad_norm on one process: the norm written out in closed form,
// which entries are counted and which scaled, f64 accumulation, explicit
// gradients, and (where a GPU is present) CUDA gradients.
#include "torus/optim/clip.h"

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "torus/core/error.h"

namespace torus::optim {
namespace {

TEST(ClipGradNorm, ScalesToMaxNormAndCountsOnlyCountedEntries) {
  at::Tensor a = at::zeros({4}, at::kDouble).requires_grad_(), b = at::zeros({2}, at::kDouble).requires_grad_();
  a.mutable_grad() = at::full({4}, 3.0, at::kDouble);  // |a.grad| = 6
  b.mutable_grad() = at::full({2}, 100.0, at::kDouble);
  // b is not counted (say, a TP replica owned by another rank) but is scaled.
  ClipResult r = clip_grad_norm({{a, true}, {b, false}}, 1.5, nullptr);
  EXPECT_TRUE(r.finite);
  EXPECT_DOUBLE_EQ(r.norm, 6.0);
  EXPECT_NEAR(r.coefficient, 1.5 / (6.0 + 1e-6), 1e-15);
  EXPECT_NEAR(a.grad()[0].item<double>(), 3.0 * 1.5 / (6.0 + 1e-6), 1e-12);
  EXPECT_NEAR(b.grad()[0].item<double>(), 100.0 * 1.5 / (6.0 + 1e-6), 1e-10);
  // Below the threshold nothing changes; max_norm 0 only measures.
  ClipResult r2 = clip_grad_norm({{a, true}}, 100.0, nullptr);
  EXPECT_EQ(r2.coefficient, 1.0);
  EXPECT_THROW(clip_grad_norm({{a, true}}, -1.0, nullptr), InvalidArgument);
  a.mutable_grad()[0] = std::numeric_limits<double>::infinity();
  ClipResult r3 = clip_grad_norm({{a, true}}, 1.0, nullptr);
  EXPECT_FALSE(r3.finite);
  EXPECT_TRUE(std::isinf(a.grad()[0].item<double>()));  // not scaled
}

TEST(ClipGradNorm, AccumulatesHalfAndSingleGradientsInDouble) {
  // 1e20^2 overflows f32 and 300^2 overflows f16: the squares must be summed in f64.
  at::Tensor a = at::zeros({8}).requires_grad_(), h = at::zeros({3}, at::kHalf).requires_grad_();
  a.mutable_grad() = at::full({8}, 1e20f);
  h.mutable_grad() = at::full({3}, 300.0, at::kHalf);
  ClipResult r = clip_grad_norm({{a}}, 0.0, nullptr);
  EXPECT_TRUE(r.finite);
  EXPECT_NEAR(r.norm / (1e20 * std::sqrt(8.0)), 1.0, 1e-7);
  ClipResult rh = clip_grad_norm({{h}}, 0.0, nullptr);
  EXPECT_DOUBLE_EQ(rh.norm, 300.0 * std::sqrt(3.0));
}

TEST(ClipGradNorm, ExplicitGradientReplacesParamGrad) {
  // A bf16 parameter whose fp32 main gradient is held elsewhere.
  at::Tensor p = at::zeros({4}, at::kBFloat16).requires_grad_();
  p.mutable_grad() = at::full({4}, 1000.0, at::kBFloat16);  // ignored
  at::Tensor main = at::full({4}, 2.0);                     // |main| = 4
  ClipResult r = clip_grad_norm({{.param = p, .grad = main}}, 1.0, nullptr);
  EXPECT_DOUBLE_EQ(r.norm, 4.0);
  EXPECT_NEAR(main[0].item<float>(), 2.0 / (4.0 + 1e-6), 1e-7);
  EXPECT_EQ(p.grad()[0].item<float>(), 1000.0f);
  // Without a parameter at all, and an entry listed twice is scaled once.
  at::Tensor g = at::full({1}, 10.0);
  ClipResult r2 = clip_grad_norm(
      {{.param = {}, .counted = true, .grad = g}, {.param = {}, .counted = false, .grad = g}}, 5.0, nullptr);
  EXPECT_DOUBLE_EQ(r2.norm, 10.0);
  EXPECT_NEAR(g.item<float>(), 10.0 * 5.0 / (10.0 + 1e-6), 1e-5);
}

TEST(ClipGradNorm, CudaGradients) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::Tensor a = at::full({4}, 3.0, at::TensorOptions().device(at::kCUDA));
  at::Tensor b = at::full({2}, 4.0, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
  at::Tensor c = at::full({1}, 5.0);  // a CPU gradient in the same call
  ClipResult r = clip_grad_norm({{.grad = a}, {.grad = b}, {.grad = c}}, 1.0, nullptr);
  const double norm = std::sqrt(4 * 9.0 + 2 * 16.0 + 25.0);
  EXPECT_NEAR(r.norm, norm, 1e-12);
  EXPECT_NEAR(a.cpu()[0].item<float>(), 3.0 / (norm + 1e-6), 1e-6);
  EXPECT_NEAR(c[0].item<float>(), 5.0 / (norm + 1e-6), 1e-6);
}

}  // namespace
}  // namespace torus::optim
