// The tensor-parallel building blocks in bf16 and f16 against the same
// computation in f64 on the same (rounded) inputs, on 1-4 ranks: every
// region mapping, the column/row-parallel linears (fused and with deferred
// weight gradients), the vocab-parallel embedding, LayerNorm and the
// vocab-parallel cross entropy; output and gradient dtypes; the layers under
// CPU autocast with fp32 parameters.
//
// Note [Half-precision tolerances]: u is the unit roundoff of the dtype
// (bf16 2^-8, f16 2^-11). Every check is element-wise, |got - ref| <= bound:
//  * data movement (split, gather, the lookup) is exact: bound 0;
//  * a sum of t terms (the TP all-reduce / reduce-scatter, t ranks) rounded
//    at most once per addition (hop by hop in the dtype on a ring, once from
//    fp32 on the mpi backend): t * u * sum_q |x_q|;
//  * a dot product of K terms in the dtype (any order, any accumulator at
//    least as wide): the textbook bound gamma_K ~ K * u times |a| . |b|, plus
//    one rounding per TP partial and one for the output: (K + t + 1) * u *
//    (|a| . |b|). ATen accumulates in fp32, so the observed error is ~u;
//  * a quantity Torus computes in fp32 and rounds once (LayerNorm, the
//    embedding's gradient, the cross entropy's gradient): u * |ref| plus fp32
//    noise n * 2^-24 * max|ref| for a reduction of length n; the cross
//    entropy's loss, fp32 end to end, has the fp32 noise alone. These tight
//    bounds are what tells a computation in fp32 from one in the dtype (the
//    latter is off by up to n * u).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Reduction.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "parallel/parallel_test_util.h"
#include "torus/amp/autocast.h"
#include "torus/parallel/tensor/cross_entropy.h"
#include "torus/parallel/tensor/layers.h"
#include "torus/parallel/tensor/mappings.h"
#include "torus/parallel/tensor/weight_grad.h"

namespace torus::tp {
namespace {

using testing::mesh_groups;
using testing::same_randn;
using testing::world;

constexpr at::ScalarType kHalfTypes[] = {at::kBFloat16, at::kHalf};
const double kF32Eps = std::ldexp(1.0, -24);

double unit_roundoff(at::ScalarType t) { return t == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

std::vector<int> tp_sizes() {
  std::vector<int> out;
  for (int t = 1; t <= world()->size(); ++t) {
    if (world()->size() % t == 0) out.push_back(t);
  }
  return out;
}

at::Tensor block(const at::Tensor& x, int64_t dim, int r, int n) { return x.chunk(n, dim)[r]; }
at::Tensor f64(const at::Tensor& x) { return x.detach().to(at::kDouble); }
// A half tensor, the same on every rank (seeded), or different per rank.
at::Tensor half_randn(at::IntArrayRef shape, uint64_t seed, at::ScalarType t) { return same_randn(shape, seed).to(t); }
at::Tensor rank_half(at::IntArrayRef shape, uint64_t seed, int r, at::ScalarType t) {
  return half_randn(shape, seed + 1000 * r, t);
}

// |got - ref| <= bound element-wise (ref and bound in f64).
void expect_within(const at::Tensor& got, const at::Tensor& ref, const at::Tensor& bound, const std::string& what) {
  ASSERT_EQ(got.sizes(), ref.sizes()) << what;
  at::Tensor excess = (f64(got) - ref).abs() - bound;
  const double worst = excess.numel() ? excess.max().item<double>() : 0.0;
  EXPECT_LE(worst, 0.0) << what << ": exceeds its bound by " << worst << " (bound max "
                        << bound.max().item<double>() << ")";
}
void expect_exact(const at::Tensor& got, const at::Tensor& ref, const std::string& what) {
  EXPECT_TRUE(at::equal(got, ref.to(got.scalar_type()))) << what;
}
// Once-rounded fp32 result: u * |ref| + n * 2^-24 * max|ref|.
at::Tensor once_rounded(const at::Tensor& ref, double u, int64_t n) {
  return ref.abs() * u + static_cast<double>(n) * kF32Eps * ref.abs().max();
}

TEST(HalfMappings, DtypesPreservedAndResultsWithinTheirBounds) {
  for (at::ScalarType dt : kHalfTypes) {
    const double u = unit_roundoff(dt);
    for (int t : tp_sizes()) {
      SCOPED_TRACE(fmt::format("{} tp={}", c10::toString(dt), t));
      const auto& g = mesh_groups(world()->size() / t, t).tp;
      const int r = g->rank();
      const std::vector<int64_t> shape{2 * t, 5, 3 * t};
      // Sum over ranks of per-rank tensors in f64, and of their magnitudes.
      auto sum64 = [&](uint64_t seed, at::IntArrayRef s, bool abs) {
        at::Tensor acc = at::zeros(s, at::TensorOptions().dtype(at::kDouble));
        for (int q = 0; q < t; ++q) acc += abs ? f64(rank_half(s, seed, q, dt)).abs() : f64(rank_half(s, seed, q, dt));
        return acc;
      };
      auto cat_ranks = [&](uint64_t seed, at::IntArrayRef s, int64_t dim) {
        std::vector<at::Tensor> parts;
        for (int q = 0; q < t; ++q) parts.push_back(rank_half(s, seed, q, dt));
        return at::cat(parts, dim);
      };
      auto check_grad = [&](const at::Tensor& x) {
        ASSERT_TRUE(x.grad().defined());
        EXPECT_EQ(x.grad().scalar_type(), dt);
      };
      {  // copy_to_tp_region: identity / all-reduce
        at::Tensor x = half_randn(shape, 1, dt).requires_grad_(true);
        at::Tensor y = copy_to_tp_region(x, g);
        EXPECT_EQ(y.scalar_type(), dt);
        y.backward(rank_half(shape, 2, r, dt));
        check_grad(x);
        expect_within(x.grad(), sum64(2, shape, false), sum64(2, shape, true) * (t * u), "copy_to_tp backward");
      }
      {  // reduce_from_tp_region: all-reduce / identity
        at::Tensor x = rank_half(shape, 3, r, dt).requires_grad_(true);
        at::Tensor y = reduce_from_tp_region(x, g);
        EXPECT_EQ(y.scalar_type(), dt);
        expect_within(y, sum64(3, shape, false), sum64(3, shape, true) * (t * u), "reduce_from_tp forward");
        at::Tensor dy = half_randn(shape, 4, dt);
        y.backward(dy);
        check_grad(x);
        expect_exact(x.grad(), dy, "reduce_from_tp backward");
      }
      {  // scatter_to_tp_region / gather_from_tp_region: exact both ways
        at::Tensor x = half_randn(shape, 5, dt).requires_grad_(true);
        at::Tensor y = scatter_to_tp_region(x, g);
        expect_exact(y, block(x.detach(), -1, r, t), "scatter_to_tp forward");
        y.backward(rank_half(y.sizes(), 6, r, dt));
        check_grad(x);
        expect_exact(x.grad(), cat_ranks(6, y.sizes(), -1), "scatter_to_tp backward");
        at::Tensor z = rank_half({2 * t, 5, 3}, 7, r, dt).requires_grad_(true);
        at::Tensor w = gather_from_tp_region(z, g);
        expect_exact(w, cat_ranks(7, {2 * t, 5, 3}, -1), "gather_from_tp forward");
        at::Tensor dw = half_randn(w.sizes(), 8, dt);
        w.backward(dw);
        check_grad(z);
        expect_exact(z.grad(), block(dw, -1, r, t), "gather_from_tp backward");
      }
      {  // scatter_to_sequence_region: split / all-gather dim 0
        at::Tensor x = half_randn(shape, 9, dt).requires_grad_(true);
        at::Tensor y = scatter_to_sequence_region(x, g);
        expect_exact(y, block(x.detach(), 0, r, t), "scatter_to_sequence forward");
        y.backward(rank_half(y.sizes(), 10, r, dt));
        check_grad(x);
        expect_exact(x.grad(), cat_ranks(10, y.sizes(), 0), "scatter_to_sequence backward");
      }
      for (bool partial : {true, false}) {  // gather_from_sequence_region
        const std::vector<int64_t> part{2, 5, 3 * t};
        at::Tensor x = rank_half(part, 11, r, dt).requires_grad_(true);
        at::Tensor y = gather_from_sequence_region(x, g, partial);
        expect_exact(y, cat_ranks(11, part, 0), "gather_from_sequence forward");
        if (partial) {  // reduce-scatter of partial gradients
          y.backward(rank_half(y.sizes(), 12, r, dt));
          expect_within(x.grad(), block(sum64(12, y.sizes(), false), 0, r, t),
                        block(sum64(12, y.sizes(), true), 0, r, t) * (t * u), "gather_from_sequence backward");
        } else {
          at::Tensor dy = half_randn(y.sizes(), 13, dt);
          y.backward(dy);
          expect_exact(x.grad(), block(dy, 0, r, t), "gather_from_sequence backward (split)");
        }
        check_grad(x);
      }
      {  // reduce_scatter_to_sequence_region: reduce-scatter / all-gather
        at::Tensor x = rank_half(shape, 14, r, dt).requires_grad_(true);
        at::Tensor y = reduce_scatter_to_sequence_region(x, g);
        EXPECT_EQ(y.scalar_type(), dt);
        expect_within(y, block(sum64(14, shape, false), 0, r, t), block(sum64(14, shape, true), 0, r, t) * (t * u),
                      "reduce_scatter_to_sequence forward");
        y.backward(rank_half(y.sizes(), 15, r, dt));
        check_grad(x);
        expect_exact(x.grad(), cat_ranks(15, y.sizes(), 0), "reduce_scatter_to_sequence backward");
      }
    }
  }
}

// One linear y = x W^T + b in the dtype, against f64 on the rounded values.
// Bounds (Note [Half-precision tolerances]): y over K = in features (plus
// the TP partials for a row-parallel layer, plus the bias add), dx over the
// out features (plus the TP all-reduce for a column-parallel layer), dW and
// db over the N tokens.
struct LinearCase {
  bool row = false;  // row parallel (else column parallel)
  bool sp = false;
  bool defer = false;
};

void check_linear(const LinearCase& c, at::ScalarType dt, int t) {
  const double u = unit_roundoff(dt);
  const auto& g = mesh_groups(world()->size() / t, t).tp;
  const int r = g->rank();
  const int64_t in = c.row ? 3 * t : 8, out = c.row ? 8 : 2 * t, s = 2 * t, b = 3, N = s * b;
  const auto opts = at::TensorOptions().dtype(dt);
  std::shared_ptr<torch::nn::Module> layer;
  at::Tensor weight, bias, full_w, full_b;
  if (c.row) {
    RowParallelLinearOptions o{.in_features = in, .out_features = out, .sequence_parallel = c.sp,
                               .init = {8, 0.5}, .tensor_options = opts};
    auto l = std::make_shared<RowParallelLinear>(o, g);
    RowParallelLinear full(o, nullptr);
    layer = l, weight = l->weight(), bias = l->bias(), full_w = full.weight().detach(),
    full_b = half_randn({out}, 30, dt);
    at::NoGradGuard ng;
    bias.copy_(full_b);
  } else {
    ColumnParallelLinearOptions o{.in_features = in, .out_features = out, .sequence_parallel = c.sp,
                                  .init = {7, 0.5}, .tensor_options = opts};
    auto l = std::make_shared<ColumnParallelLinear>(o, g);
    ColumnParallelLinear full(o, nullptr);
    layer = l, weight = l->weight(), bias = l->bias(), full_w = full.weight().detach(),
    full_b = half_randn({out}, 30, dt);
    at::NoGradGuard ng;
    bias.copy_(block(full_b, 0, r, t));
  }
  at::Tensor x = half_randn({s, b, in}, 32, dt);
  at::Tensor dy = half_randn({s, b, out}, 33, dt);
  at::Tensor W = f64(full_w).requires_grad_(true), B = f64(full_b).requires_grad_(true);
  at::Tensor X = f64(x).requires_grad_(true);
  at::Tensor Y = at::linear(X, W, B);
  Y.backward(f64(dy));
  at::Tensor y_mag = at::linear(f64(x).abs(), W.detach().abs(), B.detach().abs());
  at::Tensor y_bound = y_mag * ((in + (c.row ? t : 0) + 2) * u);
  at::Tensor dy2 = f64(dy).abs().reshape({N, out});
  at::Tensor dx_bound = at::mm(dy2, W.detach().abs()).reshape(x.sizes()) * ((out + (c.row ? 0 : t) + 1) * u);
  at::Tensor dw_bound = at::mm(dy2.t(), f64(x).abs().reshape({N, in})) * ((N + 1) * u);
  at::Tensor db_bound = dy2.sum(0) * ((N + 1) * u);

  // This rank's slices: the input (split features for row, split sequence
  // under SP), the output, the parameters.
  at::Tensor xl = c.row ? block(x, -1, r, t) : x;
  if (c.sp && !c.row) xl = block(xl, 0, r, t);
  xl = xl.clone().requires_grad_(true);
  auto out_slice = [&](const at::Tensor& v) { return c.row ? (c.sp ? block(v, 0, r, t) : v) : block(v, -1, r, t); };
  auto in_slice = [&](const at::Tensor& v) {
    at::Tensor w = c.row ? block(v, -1, r, t) : v;
    return c.sp && !c.row ? block(w, 0, r, t) : w;
  };
  auto w_slice = [&](const at::Tensor& v) { return block(v, c.row ? 1 : 0, r, t); };
  // Under SP the row layer's bias gradient is this rank's slice of the
  // sequence only (partial over TP); the column layer's is its shard.
  at::Tensor db_ref = c.row ? (c.sp ? block(f64(dy), 0, r, t).sum(at::IntArrayRef{0, 1}) : B.grad()) : block(B.grad(), 0, r, t);
  at::Tensor db_bnd = c.row ? (c.sp ? block(f64(dy).abs(), 0, r, t).sum(at::IntArrayRef{0, 1}) * ((N + 1) * u) : db_bound)
                            : block(db_bound, 0, r, t);

  at::Tensor y;
  {
    DeferWeightGradGuard guard(c.defer);
    y = c.row ? std::static_pointer_cast<RowParallelLinear>(layer)->forward(xl)
              : std::static_pointer_cast<ColumnParallelLinear>(layer)->forward(xl);
  }
  EXPECT_EQ(y.scalar_type(), dt);
  expect_within(y, out_slice(Y.detach()), out_slice(y_bound), "y");
  WeightGradStore store;
  {
    WeightGradStoreGuard sg(c.defer ? &store : nullptr);
    y.backward(out_slice(dy).contiguous());
  }
  if (c.defer) {
    EXPECT_FALSE(store.empty());
    EXPECT_FALSE(weight.grad().defined()) << "deferred weight gradient arrived in the fused backward";
    store.flush();
  }
  for (const at::Tensor& p : {weight, bias, xl}) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().scalar_type(), dt);
  }
  expect_within(xl.grad(), in_slice(X.grad()), in_slice(dx_bound), "dx");
  expect_within(weight.grad(), w_slice(W.grad()), w_slice(dw_bound), "dW");
  expect_within(bias.grad(), db_ref, db_bnd, "db");
}

TEST(HalfLayers, LinearsMatchF64WithinTheDotProductBound) {
  for (at::ScalarType dt : kHalfTypes) {
    for (int t : tp_sizes()) {
      for (bool row : {false, true}) {
        for (bool sp : {false, true}) {
          for (bool defer : {false, true}) {
            SCOPED_TRACE(fmt::format("{} tp={} {} sp={} defer={}", c10::toString(dt), t, row ? "row" : "column", sp,
                                     defer));
            check_linear({row, sp, defer}, dt, t);
          }
        }
      }
    }
  }
}

// Many tokens per row: the table's gradient is a long sum, formed in fp32
// and rounded once (Note [Embedding gradient in fp32]).
TEST(HalfLayers, EmbeddingGradientIsSummedInFp32) {
  for (at::ScalarType dt : kHalfTypes) {
    const double u = unit_roundoff(dt);
    for (int t : tp_sizes()) {
      for (bool sp : {false, true}) {
        SCOPED_TRACE(fmt::format("{} tp={} sp={}", c10::toString(dt), t, sp));
        const auto& g = mesh_groups(world()->size() / t, t).tp;
        const int r = g->rank();
        VocabParallelEmbeddingOptions o{.num_embeddings = 61, .embedding_dim = 8, .reduce_scatter_output = sp,
                                        .init = {9, 1.0}, .tensor_options = at::TensorOptions().dtype(dt)};
        VocabParallelEmbedding layer(o, g), full(o, nullptr);
        // 512 tokens over rows {0, 1, 2, 60} (60 lives on the last TP rank).
        at::Tensor tokens = testing::same_tokens({64 * t, 8}, 4, 24);
        tokens.masked_fill_(tokens.eq(3), 60);
        at::Tensor dy = half_randn({64 * t, 8, 8}, 25, dt);
        at::Tensor Wf = f64(full.weight()).requires_grad_(true);
        at::Tensor Y = at::embedding(Wf, tokens);
        Y.backward(f64(dy));
        at::Tensor y = layer.forward(tokens);
        EXPECT_EQ(y.scalar_type(), dt);
        expect_exact(y, sp ? block(Y.detach(), 0, r, t) : Y.detach(), "lookup");
        y.backward(sp ? block(dy, 0, r, t).contiguous() : dy);
        ASSERT_TRUE(layer.weight().grad().defined());
        EXPECT_EQ(layer.weight().grad().scalar_type(), dt);
        at::Tensor ref = at::cat({Wf.grad(), at::zeros({layer.padded_vocab() - 61, 8}, Wf.options())});
        ref = block(ref, 0, r, t);
        expect_within(layer.weight().grad(), ref, once_rounded(ref, u, tokens.numel()), "embedding gradient");
      }
    }
  }
}

TEST(HalfLayers, LayerNormComputesInFp32AndRoundsOnce) {
  for (at::ScalarType dt : kHalfTypes) {
    const double u = unit_roundoff(dt);
    SCOPED_TRACE(c10::toString(dt));
    const int64_t h = 64;
    LayerNorm ln({h, 1e-5, false, at::TensorOptions().dtype(dt)});
    {
      at::NoGradGuard ng;
      ln.weight().copy_(half_randn({h}, 40, dt));
      ln.bias().copy_(half_randn({h}, 41, dt));
    }
    // A large common offset: E[x^2] - E[x]^2 in the dtype would cancel.
    at::Tensor x = (same_randn({6, 4, h}, 42) + 20).to(dt).requires_grad_(true);
    at::Tensor dy = half_randn({6, 4, h}, 43, dt);
    at::Tensor X = f64(x).requires_grad_(true), G = f64(ln.weight()).requires_grad_(true),
               B = f64(ln.bias()).requires_grad_(true);
    at::Tensor Y = at::layer_norm(X, {h}, G, B, 1e-5);
    Y.backward(f64(dy));
    at::Tensor y = ln.forward(x);
    EXPECT_EQ(y.scalar_type(), dt);
    y.backward(dy);
    for (const at::Tensor& p : {x, ln.weight(), ln.bias()}) EXPECT_EQ(p.grad().scalar_type(), dt);
    // The statistics see h elements, the parameter gradients 24 tokens; the
    // input gradient of x ~ 20 loses log2(20) more bits to cancellation in
    // fp32 (a factor 32 on the fp32 noise).
    expect_within(y, Y.detach(), once_rounded(Y.detach(), u, h), "y");
    expect_within(x.grad(), X.grad(), once_rounded(X.grad(), u, 32 * h), "dx");
    expect_within(ln.weight().grad(), G.grad(), once_rounded(G.grad(), u, 24 * 32), "dweight");
    expect_within(ln.bias().grad(), B.grad(), once_rounded(B.grad(), u, 24), "dbias");
  }
}

TEST(HalfCrossEntropy, LossIsFp32AndTheGradientRoundedOnce) {
  for (at::ScalarType dt : kHalfTypes) {
    const double u = unit_roundoff(dt);
    for (int t : tp_sizes()) {
      for (int64_t multiple : {1, 8}) {
        SCOPED_TRACE(fmt::format("{} tp={} pad multiple={}", c10::toString(dt), t, multiple));
        const auto& g = mesh_groups(world()->size() / t, t).tp;
        const int r = g->rank();
        const int64_t vocab = 61, padded = pad_vocab(vocab, t, multiple);
        at::Tensor logits = (same_randn({5, 3, vocab}, 27) * 3 + 8).to(dt);  // offset: exp in the dtype would lose it
        at::Tensor targets = testing::same_tokens({5, 3}, vocab, 28);
        targets[1][2] = -100;
        at::Tensor L = f64(logits).requires_grad_(true);
        at::Tensor ref =
            at::cross_entropy_loss(L.reshape({-1, vocab}), targets.reshape({-1}), {}, at::Reduction::None).view({5, 3});
        at::Tensor dl = same_randn({5, 3}, 29);  // the loss is fp32: so is its gradient
        ref.backward(f64(dl));
        at::Tensor padded_logits = at::cat({logits, at::full({5, 3, padded - vocab}, 1e4).to(dt)}, -1);
        at::Tensor local = block(padded_logits, -1, r, t).clone().requires_grad_(true);
        at::Tensor loss = vocab_parallel_cross_entropy(local, targets, g, {.vocab_size = vocab});
        EXPECT_EQ(loss.scalar_type(), at::kFloat);
        // fp32 end to end: the fp32 noise of a log-sum-exp over the vocabulary.
        expect_within(loss, ref.detach(), at::full_like(ref, vocab * kF32Eps * ref.abs().max().item<double>()).detach(),
                      "loss");
        loss.backward(dl);
        EXPECT_EQ(local.grad().scalar_type(), dt);
        at::Tensor ref_grad = block(at::cat({L.grad(), at::zeros({5, 3, padded - vocab}, L.options())}, -1), -1, r, t);
        expect_within(local.grad(), ref_grad, once_rounded(ref_grad, u, vocab), "dlogits");
      }
    }
  }
}

// fp32 parameters, the layers run under CPU autocast bf16: forward under the
// guard, backward outside it (as in PyTorch). The gradients are fp32 and
// close to the fp32 run: autocast rounds the matmul inputs (x, W, the
// hidden activation, dy) to bf16, a few relative errors of u each.
TEST(HalfLayers, LayersWorkUnderCpuAutocast) {
  const double u = unit_roundoff(at::kBFloat16);
  for (int t : tp_sizes()) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE(fmt::format("tp={} sp={}", t, sp));
      const auto& g = mesh_groups(world()->size() / t, t).tp;
      const int r = g->rank();
      const int64_t h = 8, vocab = 16 * t;
      ColumnParallelLinearOptions co{.in_features = h, .out_features = 4 * t, .sequence_parallel = sp, .init = {1, 0.5}};
      RowParallelLinearOptions ro{.in_features = 4 * t, .out_features = h, .sequence_parallel = sp, .init = {2, 0.5}};
      ColumnParallelLinearOptions vo{.in_features = h, .out_features = vocab, .bias = false, .sequence_parallel = sp,
                                     .init = {3, 0.5}};
      auto run = [&](bool autocast, bool defer, std::vector<at::Tensor>* grads) {
        ColumnParallelLinear fc1(co, g), head(vo, g);
        RowParallelLinear fc2(ro, g);
        LayerNorm ln({h, 1e-5, sp});
        at::Tensor x = same_randn({2 * t, 3, h}, 50);
        if (sp) x = block(x, 0, r, t).contiguous();
        at::Tensor targets = testing::same_tokens({2 * t, 3}, vocab, 51);
        at::Tensor loss;
        {
          std::optional<amp::AutocastGuard> guard;
          if (autocast) guard.emplace(c10::DeviceType::CPU, at::kBFloat16);
          DeferWeightGradGuard dg(defer);
          at::Tensor z = x + fc2.forward(at::gelu(fc1.forward(x)));
          at::Tensor logits = head.forward(ln.forward(z));
          EXPECT_EQ(logits.scalar_type(), autocast ? at::kBFloat16 : at::kFloat);
          loss = vocab_parallel_cross_entropy(logits, targets, g).mean();
        }
        EXPECT_EQ(loss.scalar_type(), at::kFloat);
        WeightGradStore store;
        {
          WeightGradStoreGuard sg(defer ? &store : nullptr);
          loss.backward();
        }
        store.flush();
        for (const at::Tensor& p : {fc1.weight(), fc1.bias(), fc2.weight(), fc2.bias(), head.weight(), ln.weight()}) {
          EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
          grads->push_back(p.grad().clone());
        }
        return loss.item<double>();
      };
      std::vector<at::Tensor> ref, got;
      const double l_ref = run(false, false, &ref);
      for (bool defer : {false, true}) {
        got.clear();
        const double l = run(true, defer, &got);
        EXPECT_LE(std::abs(l - l_ref) / std::abs(l_ref), 4 * u) << "defer=" << defer;
        for (size_t i = 0; i < ref.size(); ++i) {
          EXPECT_LE(testing::rel_diff(got[i], ref[i]), 16 * u) << "gradient " << i << " defer=" << defer;
        }
      }
    }
  }
}

}  // namespace
}  // namespace torus::tp
