// torus::optim on one process: the fused AdamW against torch::optim::AdamW
// (an independent implementation, many element-wise passes) and gradient
// clipping against the norm written out.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "torus/core/error.h"
#include "torus/optim/adamw.h"
#include "torus/optim/clip.h"

namespace torus::optim {
namespace {

double rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

void compare_with_torch(at::ScalarType dtype, double tol) {
  at::manual_seed(7);
  auto make = [&](std::vector<int64_t> shape) { return at::randn(shape, at::TensorOptions().dtype(dtype)).requires_grad_(); };
  std::vector<at::Tensor> ours = {make({64, 33}), make({33}), make({5, 4, 3}), make({7})};
  std::vector<at::Tensor> ref;
  for (auto& p : ours) ref.push_back(p.detach().clone().requires_grad_());
  AdamW opt({{{ours[0], ours[2]}, 0.1}, {{ours[1], ours[3]}, 0.0}}, {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{ref[0], ref[2]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(std::vector<at::Tensor>{ref[1], ref[3]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  torch::optim::AdamW torch_opt(groups, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 6; ++step) {
    for (size_t i = 0; i < ours.size(); ++i) {
      if (step == 2 && i == 3) continue;  // no gradient this step: skipped by both
      at::Tensor g = at::randn(ours[i].sizes(), at::TensorOptions().dtype(dtype));
      ours[i].mutable_grad() = g.clone();
      ref[i].mutable_grad() = g.clone();
    }
    opt.step();
    torch_opt.step();
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_LE(rel(ours[i].detach(), ref[i].detach()), tol) << "step " << step << " param " << i;
      ours[i].mutable_grad() = at::Tensor();
      ref[i].mutable_grad() = at::Tensor();
    }
  }
  EXPECT_EQ(opt.step_count(0, 0), 6);
  EXPECT_EQ(opt.step_count(1, 1), 5);  // skipped once
}

TEST(FusedAdamW, MatchesTorchAdamWFloat32) { compare_with_torch(at::kFloat, 2e-6); }
TEST(FusedAdamW, MatchesTorchAdamWFloat64) { compare_with_torch(at::kDouble, 1e-12); }

TEST(FusedAdamW, RejectsBadInput) {
  at::Tensor p = at::zeros({3}).requires_grad_();
  EXPECT_THROW(AdamW({{{p}, 0.0}}, {.lr = -1}), InvalidArgument);
  EXPECT_THROW(AdamW({{{p}, 0.0}}, {.beta1 = 1.0}), InvalidArgument);
  EXPECT_THROW(AdamW({{{p}, 0.0}}, {.eps = 0}), InvalidArgument);
  EXPECT_THROW(AdamW({{{p}, -0.1}}, {}), InvalidArgument);
  EXPECT_THROW(AdamW({{{p, p}, 0.0}}, {}), InvalidArgument);
  EXPECT_THROW(AdamW({{{p}, 0.0}, {{p}, 0.1}}, {}), InvalidArgument);
}

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

}  // namespace
}  // namespace torus::optim
