// Tensor- and sequence-parallel building blocks against plain torch, on 1-4
// ranks: every region mapping, the three parallel layers and LayerNorm
// (forward and backward, with and without sequence parallelism), the
// vocab-parallel cross entropy (padding, ignore_index), layout-independent
// initialisation and gathering, bad configurations rejected before any
// communication, and the dropout RNG rule.
//
// Each check runs for every TP size that divides the world (the TP group of
// a dp x tp mesh). References are computed on every rank from full tensors
// that are identical on all ranks (seeded), with no communication.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Reduction.h>
#include <gtest/gtest.h>

#include "parallel/parallel_test_util.h"
#include "torus/parallel/tensor/cross_entropy.h"
#include "torus/parallel/tensor/layers.h"
#include "torus/parallel/tensor/mappings.h"
#include "torus/parallel/tensor/random.h"
#include "torus/parallel/tensor/sharding.h"

namespace torus::tp {
namespace {

using testing::mesh_groups;
using testing::rel_diff;
using testing::same_randn;
using testing::world;

constexpr double kTol = 1e-5;  // f32, relative to the largest magnitude

// TP sizes to test on this world: every divisor > 0 (the mesh is dp x tp).
std::vector<int> tp_sizes() {
  std::vector<int> out;
  const int n = world()->size();
  for (int t = 1; t <= n; ++t) {
    if (n % t == 0) out.push_back(t);
  }
  return out;
}

// Rank r's block of x along dim (n equal blocks).
at::Tensor block(const at::Tensor& x, int64_t dim, int r, int n) {
  return x.chunk(n, dim)[r];
}

// A gradient different on every TP rank, known to all (seed + rank).
at::Tensor rank_randn(at::IntArrayRef shape, uint64_t seed, int r) {
  return same_randn(shape, seed + 1000 * r);
}

TEST(Mappings, ForwardAndBackwardMatchTheirDefinitions) {
  for (int t : tp_sizes()) {
    SCOPED_TRACE("tp=" + std::to_string(t));
    const auto& g = mesh_groups(world()->size() / t, t).tp;
    const int r = g->rank();
    const int64_t rows = 2 * t, cols = 3 * t;
    at::Tensor full = same_randn({rows, 5, cols}, 1);
    auto sum_over_ranks = [&](uint64_t seed, at::IntArrayRef shape) {
      at::Tensor s = at::zeros(shape);
      for (int q = 0; q < t; ++q) s += rank_randn(shape, seed, q);
      return s;
    };
    auto cat_over_ranks = [&](uint64_t seed, at::IntArrayRef shape, int64_t dim) {
      std::vector<at::Tensor> parts;
      for (int q = 0; q < t; ++q) parts.push_back(rank_randn(shape, seed, q));
      return at::cat(parts, dim);
    };
    {  // copy_to_tp_region: identity / all-reduce
      at::Tensor x = full.clone().requires_grad_(true);
      at::Tensor y = copy_to_tp_region(x, g);
      EXPECT_TRUE(at::equal(y, full));
      y.backward(rank_randn(full.sizes(), 2, r));
      EXPECT_LE(rel_diff(x.grad(), sum_over_ranks(2, full.sizes())), kTol);
    }
    {  // reduce_from_tp_region: all-reduce / identity
      at::Tensor x = rank_randn(full.sizes(), 3, r).requires_grad_(true);
      at::Tensor y = reduce_from_tp_region(x, g);
      EXPECT_LE(rel_diff(y, sum_over_ranks(3, full.sizes())), kTol);
      at::Tensor dy = same_randn(full.sizes(), 4);
      y.backward(dy);
      EXPECT_TRUE(at::equal(x.grad(), dy));
    }
    {  // scatter_to_tp_region: split last / all-gather last
      at::Tensor x = full.clone().requires_grad_(true);
      at::Tensor y = scatter_to_tp_region(x, g);
      EXPECT_TRUE(at::equal(y, block(full, -1, r, t)));
      y.backward(rank_randn(y.sizes(), 5, r));
      EXPECT_TRUE(at::equal(x.grad(), cat_over_ranks(5, y.sizes(), -1)));
    }
    {  // gather_from_tp_region: all-gather last / split last
      at::Tensor x = rank_randn({rows, 5, 3}, 6, r).requires_grad_(true);
      at::Tensor y = gather_from_tp_region(x, g);
      EXPECT_TRUE(at::equal(y, cat_over_ranks(6, {rows, 5, 3}, -1)));
      at::Tensor dy = same_randn(y.sizes(), 7);
      y.backward(dy);
      EXPECT_TRUE(at::equal(x.grad(), block(dy, -1, r, t)));
    }
    {  // scatter_to_sequence_region: split dim 0 / all-gather dim 0
      at::Tensor x = full.clone().requires_grad_(true);
      at::Tensor y = scatter_to_sequence_region(x, g);
      EXPECT_TRUE(at::equal(y, block(full, 0, r, t)));
      y.backward(rank_randn(y.sizes(), 8, r));
      EXPECT_TRUE(at::equal(x.grad(), cat_over_ranks(8, y.sizes(), 0)));
    }
    for (bool partial : {true, false}) {  // gather_from_sequence_region
      at::Tensor x = rank_randn({2, 5, cols}, 9, r).requires_grad_(true);
      at::Tensor y = gather_from_sequence_region(x, g, partial);
      EXPECT_TRUE(at::equal(y, cat_over_ranks(9, {2, 5, cols}, 0)));
      if (partial) {
        y.backward(rank_randn(y.sizes(), 10, r));  // partial sums: reduce-scatter
        EXPECT_LE(rel_diff(x.grad(), block(sum_over_ranks(10, y.sizes()), 0, r, t)), kTol);
      } else {
        at::Tensor dy = same_randn(y.sizes(), 11);  // replicated: split
        y.backward(dy);
        EXPECT_TRUE(at::equal(x.grad(), block(dy, 0, r, t)));
      }
    }
    {  // reduce_scatter_to_sequence_region: reduce-scatter dim 0 / all-gather dim 0
      at::Tensor x = rank_randn(full.sizes(), 12, r).requires_grad_(true);
      at::Tensor y = reduce_scatter_to_sequence_region(x, g);
      EXPECT_LE(rel_diff(y, block(sum_over_ranks(12, full.sizes()), 0, r, t)), kTol);
      y.backward(rank_randn(y.sizes(), 13, r));
      EXPECT_TRUE(at::equal(x.grad(), cat_over_ranks(13, y.sizes(), 0)));
    }
  }
}

TEST(Mappings, IndivisibleSplitsThrowBeforeCommunication) {
  auto g = testing::no_comm_group(0, 2);
  at::Tensor odd = at::ones({3, 5});
  EXPECT_THROW(scatter_to_tp_region(odd, g), InvalidArgument);
  EXPECT_THROW(scatter_to_sequence_region(odd, g), InvalidArgument);
  EXPECT_THROW(reduce_scatter_to_sequence_region(odd, g), InvalidArgument);
  // The no-comm group really fails on communication:
  EXPECT_THROW(reduce_from_tp_region(odd, g), CommError);
}

// A layer built with TP=1 (no group) holds the full weights of the same model.
TEST(Layers, ShardsAreSlicesOfTheSingleProcessWeights) {
  for (int t : tp_sizes()) {
    SCOPED_TRACE("tp=" + std::to_string(t));
    const auto& g = mesh_groups(world()->size() / t, t).tp;
    const int r = g->rank();
    ColumnParallelLinearOptions co{8, 4 * t, true, false, false, {42, 0.5}};
    ColumnParallelLinear col(co, g), col_full(co, nullptr);
    EXPECT_TRUE(at::equal(col.weight(), block(col_full.weight(), 0, r, t)));
    RowParallelLinearOptions ro{4 * t, 8, true, true, false, {43, 0.5}};
    RowParallelLinear row(ro, g), row_full(ro, nullptr);
    EXPECT_TRUE(at::equal(row.weight(), block(row_full.weight(), 1, r, t)));
    EXPECT_TRUE(at::equal(row.bias(), row_full.bias()));
    VocabParallelEmbeddingOptions eo{61, 8, 1, false, {44, 1.0}};
    VocabParallelEmbedding emb(eo, g), emb_full(eo, nullptr);
    EXPECT_EQ(emb.padded_vocab(), pad_vocab(61, t));
    at::Tensor padded_full = at::cat({emb_full.weight(), at::zeros({emb.padded_vocab() - 61, 8})});
    EXPECT_TRUE(at::equal(emb.weight(), block(padded_full, 0, r, t)));
    // ... and gathering restores the single-process tensors, padding dropped.
    const std::vector<std::pair<torch::nn::Module*, torch::nn::Module*>> pairs{
        {&col, &col_full}, {&row, &row_full}, {&emb, &emb_full}};
    for (const auto& [sharded, single] : pairs) {
      auto full = gather_full_parameters(*sharded, g);
      for (const auto& p : single->named_parameters()) EXPECT_TRUE(at::equal(full.at(p.key()), p.value())) << p.key();
    }
  }
}

// SkipInitDraws: normally distributed shards come out as zeros of the
// shard's shape (constants as usual), also when materialised from a
// DeferredInit recipe; outside the scope the same call draws again.
TEST(Layers, SkipInitDrawsGivesZerosOfTheShardShape) {
  const ShardSpec rows{.dim = 0};
  const InitSpec normal{InitSpec::Kind::kNormal, 0.02, 11};
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor drawn = init_shard({10, 4}, rows, 12, normal, 1, 4, opts);
  at::Tensor skipped, ones, deferred_out;
  DeferredInit deferred;
  at::Tensor recorded;
  {
    SkipInitDraws skip;
    {
      SkipInitDraws nested;
    }
    skipped = init_shard({10, 4}, rows, 12, normal, 1, 4, opts);
    ones = init_shard({4}, ShardSpec{}, -1, InitSpec{InitSpec::Kind::kOnes}, 0, 1, opts);
    {
      DeferredInit::Scope scope(deferred);
      recorded = init_shard({10, 4}, rows, 12, normal, 1, 4, opts);
    }
    deferred_out = at::ones({3, 4}, opts);  // so that zeros must be written
    deferred.materialize(recorded, deferred_out);
  }
  EXPECT_EQ(skipped.sizes(), drawn.sizes());
  EXPECT_EQ(skipped.abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(at::equal(ones, at::ones({4}, opts)));
  EXPECT_EQ(deferred_out.abs().max().item<float>(), 0.0f);
  EXPECT_GT(drawn.abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(at::equal(init_shard({10, 4}, rows, 12, normal, 1, 4, opts), drawn)) << "the scope outlived itself";
}

TEST(Layers, ColumnParallelLinearMatchesTorch) {
  for (int t : tp_sizes()) {
    for (bool sp : {false, true}) {
      for (bool gather : {false, true}) {
        SCOPED_TRACE("tp=" + std::to_string(t) + " sp=" + std::to_string(sp) + " gather=" + std::to_string(gather));
        const auto& g = mesh_groups(world()->size() / t, t).tp;
        const int r = g->rank();
        ColumnParallelLinearOptions o{6, 2 * t, true, gather, sp, {7, 0.3}};
        ColumnParallelLinear layer(o, g), ref(o, nullptr);
        {  // a non-zero bias, mirrored into the shard
          at::NoGradGuard ng;
          ref.bias().copy_(same_randn(ref.bias().sizes(), 19));
          layer.bias().copy_(block(ref.bias(), 0, r, t));
        }
        at::Tensor x = same_randn({2 * t, 3, 6}, 20);  // [s, b, in]
        at::Tensor xr = x.clone().requires_grad_(true);
        at::Tensor yr = ref.forward(xr);
        at::Tensor dy = same_randn(yr.sizes(), 21);
        yr.backward(dy);

        at::Tensor xl = (sp ? block(x, 0, r, t) : x).clone().requires_grad_(true);
        at::Tensor y = layer.forward(xl);
        EXPECT_LE(rel_diff(y, gather ? yr : block(yr, -1, r, t)), kTol);
        y.backward(gather ? dy : block(dy, -1, r, t));
        EXPECT_LE(rel_diff(xl.grad(), sp ? block(xr.grad(), 0, r, t) : xr.grad()), kTol);
        EXPECT_LE(rel_diff(layer.weight().grad(), block(ref.weight().grad(), 0, r, t)), kTol);
        EXPECT_LE(rel_diff(layer.bias().grad(), block(ref.bias().grad(), 0, r, t)), kTol);
      }
    }
  }
}

TEST(Layers, RowParallelLinearMatchesTorch) {
  for (int t : tp_sizes()) {
    for (bool sp : {false, true}) {
      for (bool parallel_in : {true, false}) {
        SCOPED_TRACE("tp=" + std::to_string(t) + " sp=" + std::to_string(sp) +
                     " parallel_in=" + std::to_string(parallel_in));
        const auto& g = mesh_groups(world()->size() / t, t).tp;
        const int r = g->rank();
        RowParallelLinearOptions o{3 * t, 5, true, parallel_in, sp, {8, 0.3}};
        RowParallelLinear layer(o, g), ref(o, nullptr);
        {
          at::NoGradGuard ng;
          ref.bias().copy_(same_randn(ref.bias().sizes(), 19));
          layer.bias().copy_(ref.bias());
        }
        at::Tensor x = same_randn({2 * t, 3, 3 * t}, 22);
        at::Tensor xr = x.clone().requires_grad_(true);
        at::Tensor yr = ref.forward(xr);
        at::Tensor dy = same_randn(yr.sizes(), 23);
        yr.backward(dy);

        at::Tensor xl = (parallel_in ? block(x, -1, r, t) : x).clone().requires_grad_(true);
        at::Tensor y = layer.forward(xl);
        EXPECT_LE(rel_diff(y, sp ? block(yr, 0, r, t) : yr), kTol);
        y.backward(sp ? block(dy, 0, r, t) : dy);
        EXPECT_LE(rel_diff(xl.grad(), parallel_in ? block(xr.grad(), -1, r, t) : xr.grad()), kTol);
        EXPECT_LE(rel_diff(layer.weight().grad(), block(ref.weight().grad(), 1, r, t)), kTol);
        // Without SP the bias gradient is complete on every rank; with SP it is
        // this rank's slice of the sequence (summed over TP by the DP wrapper).
        at::Tensor expect_db = sp ? block(dy, 0, r, t).sum(at::IntArrayRef{0, 1}) : ref.bias().grad();
        EXPECT_LE(rel_diff(layer.bias().grad(), expect_db), kTol);
        EXPECT_EQ(layer.shard_specs().at("bias").tp_partial_grad, sp);
      }
    }
  }
}

TEST(Layers, VocabParallelEmbeddingMatchesTorch) {
  for (int t : tp_sizes()) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE("tp=" + std::to_string(t) + " sp=" + std::to_string(sp));
      const auto& g = mesh_groups(world()->size() / t, t).tp;
      const int r = g->rank();
      VocabParallelEmbeddingOptions o{61, 8, 1, sp, {9, 1.0}};
      VocabParallelEmbedding layer(o, g), ref(o, nullptr);
      at::Tensor tokens = testing::same_tokens({2 * t, 3}, 61, 24);  // [s, b]
      at::Tensor yr = ref.forward(tokens);
      at::Tensor dy = same_randn(yr.sizes(), 25);
      yr.backward(dy);
      at::Tensor y = layer.forward(tokens);
      EXPECT_LE(rel_diff(y, sp ? block(yr, 0, r, t) : yr), kTol);
      y.backward(sp ? block(dy, 0, r, t) : dy);
      at::Tensor ref_grad = at::cat({ref.weight().grad(), at::zeros({layer.padded_vocab() - 61, 8})});
      EXPECT_LE(rel_diff(layer.weight().grad(), block(ref_grad, 0, r, t)), kTol);
    }
  }
}

TEST(Layers, LayerNormMarksPartialGradientsUnderSequenceParallelism) {
  LayerNorm plain({8, 1e-5, false}), sp({8, 1e-5, true});
  EXPECT_FALSE(plain.shard_specs().at("weight").tp_partial_grad);
  EXPECT_TRUE(sp.shard_specs().at("weight").tp_partial_grad);
  EXPECT_TRUE(sp.shard_specs().at("bias").tp_partial_grad);
  at::Tensor x = same_randn({4, 2, 8}, 26);
  EXPECT_LE(rel_diff(plain.forward(x), at::layer_norm(x, {8}, plain.weight(), plain.bias(), 1e-5)), 0.0);
}

TEST(CrossEntropy, MatchesTorchWithPaddingAndIgnoredTokens) {
  for (int t : tp_sizes()) {
    for (int64_t multiple : {1, 8}) {
      SCOPED_TRACE("tp=" + std::to_string(t) + " pad multiple=" + std::to_string(multiple));
      const auto& g = mesh_groups(world()->size() / t, t).tp;
      const int r = g->rank();
      const int64_t vocab = 61, padded = pad_vocab(vocab, t, multiple);
      at::Tensor logits = same_randn({5, 3, vocab}, 27).mul_(3);
      at::Tensor targets = testing::same_tokens({5, 3}, vocab, 28);
      targets[1][2] = -100;  // ignored
      at::Tensor lr = logits.clone().requires_grad_(true);
      at::Tensor ref =
          at::cross_entropy_loss(lr.reshape({-1, vocab}), targets.reshape({-1}), {}, at::Reduction::None).view({5, 3});
      at::Tensor dl = same_randn({5, 3}, 29);
      ref.backward(dl);
      // Padding columns hold huge values: they must not matter.
      at::Tensor padded_logits = at::cat({logits, at::full({5, 3, padded - vocab}, 1e4)}, -1);
      at::Tensor local = block(padded_logits, -1, r, t).clone().requires_grad_(true);
      at::Tensor loss = vocab_parallel_cross_entropy(local, targets, g, {.vocab_size = vocab});
      EXPECT_LE(rel_diff(loss, ref), kTol);
      EXPECT_EQ(loss[1][2].item<float>(), 0.0f);
      loss.backward(dl);
      at::Tensor ref_grad = at::cat({lr.grad(), at::zeros({5, 3, padded - vocab})}, -1);
      EXPECT_LE(rel_diff(local.grad(), block(ref_grad, -1, r, t)), kTol);
    }
  }
}

TEST(CrossEntropy, RejectsBadInputBeforeCommunication) {
  auto g = testing::no_comm_group(0, 2);
  at::Tensor logits = at::zeros({4, 8});
  EXPECT_THROW(vocab_parallel_cross_entropy(logits, at::zeros({4}, at::kLong), g, {.vocab_size = 17}), InvalidArgument);
  EXPECT_THROW(vocab_parallel_cross_entropy(logits, at::full({4}, 16, at::kLong), g, {.vocab_size = 16}),
               InvalidArgument);
  EXPECT_THROW(vocab_parallel_cross_entropy(logits, at::zeros({5}, at::kLong), g), InvalidArgument);
  EXPECT_THROW(vocab_parallel_cross_entropy(logits, at::zeros({4}, at::kInt), g), InvalidArgument);
}

TEST(Layers, IndivisibleSizesThrowBeforeCommunication) {
  auto g = testing::no_comm_group(1, 2);
  EXPECT_THROW(ColumnParallelLinear({4, 5}, g), InvalidArgument);
  EXPECT_THROW(RowParallelLinear({5, 4}, g), InvalidArgument);
  RowParallelLinear row({4, 4, true, true, /*sequence_parallel=*/true}, g);
  EXPECT_THROW(row.forward(at::ones({3, 1, 2})), InvalidArgument);  // sequence 3 over 2 ranks
  VocabParallelEmbedding emb({61, 4, 1, /*reduce_scatter_output=*/true}, g);
  EXPECT_EQ(emb.padded_vocab(), 62);
  EXPECT_THROW(emb.forward(at::zeros({3, 2}, at::kLong)), InvalidArgument);
  EXPECT_THROW(ColumnParallelLinear({4, 4}, g).forward(at::ones({2, 5})), InvalidArgument);
}

// Note [Dropout RNG rule]: the replicated stream is equal on all TP ranks,
// the sharded one differs; both are reproducible and restorable.
TEST(Random, DropoutStreamsFollowTheRule) {
  const int n = world()->size();
  const int r = world()->rank();
  RngTracker tracker(2024, r);
  at::Tensor x = at::ones({64, 64});
  at::Tensor rep = dropout(x, 0.5, true, tracker.generator(RngRegion::kReplicated));
  at::Tensor shd = dropout(x, 0.5, true, tracker.generator(RngRegion::kSharded));
  at::Tensor reps = all_gather_along(rep.unsqueeze(0), 0, world());
  at::Tensor shds = all_gather_along(shd.unsqueeze(0), 0, world());
  for (int q = 0; q < n; ++q) {
    EXPECT_TRUE(at::equal(reps[q], rep)) << "replicated stream differs on rank " << q;
    if (q != r) EXPECT_FALSE(at::equal(shds[q], shd)) << "sharded stream equal on ranks " << q << " and " << r;
  }
  // Inverted dropout keeps the expectation; state round-trips.
  EXPECT_NEAR(rep.mean().item<double>(), 1.0, 0.1);
  auto state = tracker.get_state();
  at::Tensor a = dropout(x, 0.3, true, tracker.generator(RngRegion::kSharded));
  tracker.set_state(state);
  at::Tensor b = dropout(x, 0.3, true, tracker.generator(RngRegion::kSharded));
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_TRUE(at::equal(dropout(x, 0.3, false, tracker.generator(RngRegion::kSharded)), x));
  EXPECT_THROW(dropout(x, 1.0, true, tracker.generator(RngRegion::kSharded)), InvalidArgument);
  EXPECT_NE(derive_seed(1, "a"), derive_seed(1, "b"));
  EXPECT_EQ(derive_seed(1, "a"), derive_seed(1, "a"));
}

}  // namespace
}  // namespace torus::tp
