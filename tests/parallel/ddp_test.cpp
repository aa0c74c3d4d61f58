// The data-parallel wrapper on 1-4 ranks: bucket planning (pure), gradients
// equal to full-batch training (average and sum), buckets started from
// backward hooks (overlap) with an unused parameter started late, no_sync
// accumulation, grads set to None by an optimizer, the initial broadcast, and
// gradients partial over TP (sequence-parallel LayerNorm) reduced over dp x tp.
//
// Each rank takes its slice of a global batch that every rank can build; the
// reference is the same model trained on the whole batch in one process.
#include "torus/parallel/data/ddp.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include "parallel/parallel_test_util.h"
#include "torus/parallel/tensor/layers.h"
#include "torus/parallel/tensor/mappings.h"

namespace torus::dp {
namespace {

using testing::mesh_groups;
using testing::rel_diff;
using testing::same_randn;
using testing::world;

constexpr double kTol = 1e-5;

TEST(BucketPlan, FillsInOrderWithASmallFirstBucket) {
  std::vector<ParamDesc> p{{10, 4, 0}, {20, 4, 0}, {30, 4, 0}, {40, 4, 0}};
  auto plans = plan_buckets(p, {.cap_bytes = 100, .first_cap_bytes = 40});
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(plans[0].params, (std::vector<int>{0}));
  EXPECT_EQ(plans[1].params, (std::vector<int>{1, 2}));
  EXPECT_EQ(plans[1].offsets, (std::vector<int64_t>{0, 20}));
  EXPECT_EQ(plans[1].numel, 50);
  EXPECT_EQ(plans[2].params, (std::vector<int>{3}));
}

TEST(BucketPlan, SeparatesKeysAndPads) {
  std::vector<ParamDesc> p{{3, 4, 0}, {5, 8, 1}, {7, 4, 0}, {1, 8, 1}};
  auto plans = plan_buckets(p, {.cap_bytes = 1 << 20, .first_cap_bytes = 1 << 20, .pad_to_multiple = 4});
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].key, 0);
  EXPECT_EQ(plans[0].params, (std::vector<int>{0, 2}));
  EXPECT_EQ(plans[0].numel, 12);  // 10 padded to a multiple of 4
  EXPECT_EQ(plans[1].params, (std::vector<int>{1, 3}));
  EXPECT_EQ(plans[1].numel, 8);
  EXPECT_THROW(plan_buckets(p, {.cap_bytes = 0}), InvalidArgument);
  EXPECT_THROW(plan_buckets(p, {.pad_to_multiple = 0}), InvalidArgument);
}

// A small MLP (built from TP layers on no group = plain layers), with one
// parameter that forward never uses.
struct Mlp : torch::nn::Module {
  explicit Mlp(uint64_t seed) {
    unused = register_parameter("unused", at::ones({3}));  // registered first: reduced last
    fc1 = register_module("fc1", std::make_shared<tp::ColumnParallelLinear>(
                                     tp::ColumnParallelLinearOptions{6, 16, true, false, false, {seed, 0.3}}, nullptr));
    ln = register_module("ln", std::make_shared<tp::LayerNorm>(tp::LayerNormOptions{16}));
    fc2 = register_module("fc2", std::make_shared<tp::RowParallelLinear>(
                                     tp::RowParallelLinearOptions{16, 4, true, true, false, {seed + 1, 0.3}}, nullptr));
  }
  // Mean over samples of sum(y^2): rows of x are samples.
  at::Tensor loss(const at::Tensor& x) {
    at::Tensor y = fc2->forward(at::gelu(ln->forward(fc1->forward(x))));
    return y.pow(2).sum(1).mean();
  }
  at::Tensor unused;
  std::shared_ptr<tp::ColumnParallelLinear> fc1;
  std::shared_ptr<tp::LayerNorm> ln;
  std::shared_ptr<tp::RowParallelLinear> fc2;
};

at::Tensor local_rows(const at::Tensor& global, int r, int n) {
  return global.chunk(n, 0)[r];
}

void expect_grads(const torch::nn::Module& got, const torch::nn::Module& want, double scale = 1.0) {
  auto w = want.named_parameters();
  for (const auto& p : got.named_parameters()) {
    if (!w[p.key()].grad().defined() && !p.value().grad().defined()) continue;  // never used, never reduced
    at::Tensor expected = w[p.key()].grad().defined() ? w[p.key()].grad() * scale : at::zeros_like(p.value());
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_LE(rel_diff(p.value().grad(), expected), kTol) << p.key();
  }
}

TEST(DDP, GradientsEqualFullBatchTraining) {
  const int n = world()->size(), r = world()->rank();
  const auto& groups = mesh_groups(n, 1);
  for (bool average : {true, false}) {
    SCOPED_TRACE(average ? "average" : "sum");
    auto model = std::make_shared<Mlp>(5);
    Mlp ref(5);
    DistributedDataParallel ddp(model, groups,
                                {.bucket_cap_bytes = 1, .first_bucket_cap_bytes = 1, .average = average});
    at::Tensor x = same_randn({4 * n, 6}, 30);
    ref.loss(x).backward();
    model->loss(local_rows(x, r, n)).backward();  // finishes the sync at the end of backward
    expect_grads(*model, ref, average ? 1.0 : n);
    auto st = ddp.stats();
    EXPECT_EQ(st.syncs, n > 1 ? 1 : 0);
    if (n > 1) {
      // One bucket per parameter; all but the unused parameter's started from hooks.
      EXPECT_EQ(ddp.buckets().size(), model->parameters().size());
      EXPECT_EQ(st.buckets_started_in_backward, static_cast<int64_t>(ddp.buckets().size()) - 1);
      EXPECT_EQ(st.buckets_started_late, 1);
      EXPECT_EQ(ddp.buckets().back().slots[0].name, "unused");
    } else {
      EXPECT_TRUE(ddp.buckets().empty());  // nothing to reduce on one rank
    }
    ddp.finish_grad_sync();  // harmless: already finished
    EXPECT_EQ(ddp.stats().syncs, st.syncs);
  }
}

TEST(DDP, ExplicitSyncWithoutOverlap) {
  const int n = world()->size(), r = world()->rank();
  auto model = std::make_shared<Mlp>(6);
  Mlp ref(6);
  DistributedDataParallel ddp(model, mesh_groups(n, 1), {.overlap = false, .finish_in_backward = false});
  at::Tensor x = same_randn({2 * n, 6}, 31);
  ref.loss(x).backward();
  model->loss(local_rows(x, r, n)).backward();
  EXPECT_EQ(ddp.stats().buckets_started_in_backward, 0);
  ddp.start_grad_sync();
  ddp.finish_grad_sync();
  expect_grads(*model, ref);
}

TEST(DDP, NoSyncAccumulatesThenReducesTheSum) {
  const int n = world()->size(), r = world()->rank();
  auto model = std::make_shared<Mlp>(7);
  Mlp ref(7), local_ref(7);
  DistributedDataParallel ddp(model, mesh_groups(n, 1));
  at::Tensor a = same_randn({2 * n, 6}, 32), b = same_randn({2 * n, 6}, 33);
  {
    auto guard = ddp.no_sync();
    model->loss(local_rows(a, r, n)).backward();
  }
  local_ref.loss(local_rows(a, r, n)).backward();
  expect_grads(*model, local_ref);  // not reduced yet
  model->loss(local_rows(b, r, n)).backward();
  (ref.loss(a) + ref.loss(b)).backward();
  expect_grads(*model, ref);
}

TEST(DDP, RestoresBucketViewsAfterGradsAreSetToNone) {
  const int n = world()->size(), r = world()->rank();
  auto model = std::make_shared<Mlp>(8);
  Mlp ref(8);
  DistributedDataParallel ddp(model, mesh_groups(n, 1));
  at::Tensor x = same_randn({2 * n, 6}, 34);
  model->loss(local_rows(x, r, n)).backward();
  for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();  // optimizer.zero_grad(set_to_none)
  model->loss(local_rows(x, r, n)).backward();
  ref.loss(x).backward();
  expect_grads(*model, ref);
  if (n > 1) {
    EXPECT_GT(ddp.stats().grads_restored, 0);
    for (const auto& b : ddp.buckets()) {
      for (const auto& s : b.slots) {
        const char* base = static_cast<const char*>(b.flat.data_ptr());
        const char* g = static_cast<const char*>(s.param.grad().data_ptr());
        EXPECT_TRUE(g >= base && g < base + b.flat.nbytes()) << s.name << " grad is not a bucket view";
      }
    }
  }
  ddp.zero_grad();
  for (auto& p : model->parameters()) {
    if (p.grad().defined()) EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  }
}

// zero_grad(set_to_none): no grads until the next backward, which copies
// each fresh gradient into its bucket; over several steps (and with no_sync
// accumulation after it) the gradients equal the reference's and are bucket
// views again.
TEST(DDP, ZeroGradToNoneThenBackwardGivesReducedBucketViews) {
  const int n = world()->size(), r = world()->rank();
  auto model = std::make_shared<Mlp>(10);
  Mlp ref(10);
  DistributedDataParallel ddp(model, mesh_groups(n, 1));
  for (int step = 0; step < 3; ++step) {
    ddp.zero_grad(/*set_to_none=*/true);
    ref.zero_grad();
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "step " << step;
    at::Tensor a = same_randn({2 * n, 6}, 40 + step), b = same_randn({2 * n, 6}, 50 + step);
    if (step == 2) {
      // Accumulation: the first backward copies into the buckets, the second adds to them.
      {
        auto guard = ddp.no_sync();
        model->loss(local_rows(a, r, n)).backward();
      }
      model->loss(local_rows(b, r, n)).backward();
      (ref.loss(a) + ref.loss(b)).backward();
    } else {
      model->loss(local_rows(a, r, n)).backward();
      ref.loss(a).backward();
    }
    expect_grads(*model, ref);
    for (const auto& bucket : ddp.buckets()) {
      const char* base = static_cast<const char*>(bucket.flat.data_ptr());
      for (const auto& s : bucket.slots) {
        const char* g = static_cast<const char*>(s.param.grad().data_ptr());
        EXPECT_TRUE(g >= base && g < base + bucket.flat.nbytes()) << s.name << " grad is not a bucket view";
      }
    }
  }
}

TEST(DDP, BroadcastsRankZerosParameters) {
  const int n = world()->size(), r = world()->rank();
  auto model = std::make_shared<Mlp>(9);
  {
    at::NoGradGuard ng;
    for (auto& p : model->parameters()) p.add_(r);
  }
  DistributedDataParallel ddp(model, mesh_groups(n, 1));
  Mlp ref(9);
  auto want = ref.named_parameters();
  for (const auto& p : model->named_parameters()) EXPECT_TRUE(at::equal(p.value(), want[p.key()])) << p.key();
}

// LayerNorm inside a sequence-parallel region: each TP rank normalises its
// slice of the sequence, so its gradients are partial over TP; the wrapper
// sums them over TP and averages over dp in one all-reduce over dp x tp.
struct SpNorm : torch::nn::Module {
  SpNorm() { ln = register_module("ln", std::make_shared<tp::LayerNorm>(tp::LayerNormOptions{8, 1e-5, true})); }
  std::shared_ptr<tp::LayerNorm> ln;
};

TEST(DDP, ReducesTensorParallelPartialGradientsOverDpAndTp) {
  const int n = world()->size();
  for (int t = 1; t <= n; ++t) {
    if (n % t != 0) continue;
    const int dp = n / t;
    SCOPED_TRACE("dp=" + std::to_string(dp) + " tp=" + std::to_string(t));
    const auto& groups = mesh_groups(dp, t);
    const int d = groups.dp_rank(), tr = groups.tp_rank();
    auto model = std::make_shared<SpNorm>();
    SpNorm ref;
    {
      at::NoGradGuard ng;
      for (auto* m : {model.get(), &ref}) {
        for (auto& p : m->parameters()) p.copy_(same_randn(p.sizes(), 40 + p.numel()));
      }
    }
    DistributedDataParallel ddp(model, groups);
    // x [s, b, h]: batch over dp, sequence over tp. Loss: sum(ln(x) * w) / dp.
    at::Tensor x = same_randn({2 * t, 2 * dp, 8}, 35), w = same_randn({2 * t, 2 * dp, 8}, 36);
    auto slice = [&](const at::Tensor& v) { return v.chunk(dp, 1)[d].chunk(t, 0)[tr]; };
    (model->ln->forward(slice(x)) * slice(w)).sum().backward();
    (ref.ln->forward(x) * w).sum().div(dp).backward();
    expect_grads(*model, ref);
  }
}

}  // namespace
}  // namespace torus::dp
