// The Llama-family decoder in one process: configuration checks, rotary
// tables against the closed form (and llama3 scaling against the rule
// written out per frequency), the forward against a plain reference written
// here from the named parameters (RMSNorm, rotate-half rotary, GQA by
// repeating kv heads, explicit causal softmax, SwiGLU), pipeline parts that
// compose to the whole model, layout-independent initialisation (split and
// replicated kv heads are slices of / equal to the TP=1 weights), parameter
// counts of the presets against their published sizes.
#include "torus/models/llama.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "parallel/parallel_test_util.h"
#include "torus/parallel/tensor/sharding.h"
#include "torus/engine/llama_model.h"
#include "torus/engine/model.h"
#include "torus/run/run_config.h"
#include "torus/run/registry.h"

namespace torus::models {
namespace {

using testing::no_comm_group;
using testing::rel_diff;
using testing::same_tokens;

parallel::ParallelGroups no_comm_tp(int rank, int size) {
  parallel::ParallelGroups g;
  g.tp = no_comm_group(rank, size);
  return g;
}

LlamaConfig test_config(at::ScalarType dtype = at::kFloat) {
  LlamaConfig c = LlamaConfig::tiny();
  c.dtype = dtype;
  c.init_std = 0.2;  // large enough that attention is far from uniform
  return c;
}

TEST(LlamaConfig, Validates) {
  LlamaConfig c = LlamaConfig::tiny();
  EXPECT_NO_THROW(c.validate(1));
  EXPECT_NO_THROW(c.validate(2));
  EXPECT_NO_THROW(c.validate(4));             // 2 kv heads over 4 ranks: replicated
  EXPECT_THROW(c.validate(3), InvalidArgument);  // 4 heads over 3 ranks
  EXPECT_TRUE(c.kv_split(2));
  EXPECT_FALSE(c.kv_split(4));
  LlamaConfig gqa = c;
  gqa.num_kv_heads = 3;  // 4 heads are not groups of 3
  EXPECT_THROW(gqa.validate(1), InvalidArgument);
  LlamaConfig rope = c;
  rope.rope_scaling.type = "yarn";
  EXPECT_THROW(rope.validate(1), InvalidArgument);
  rope.rope_scaling = {"llama3", 8.0, 4.0, 1.0, 8192};  // low >= high
  EXPECT_THROW(rope.validate(1), InvalidArgument);
  LlamaConfig odd = c;
  odd.head_dim = 7;
  EXPECT_THROW(odd.validate(1), InvalidArgument);
  EXPECT_THROW(c.validate_sequence(17, 1), InvalidArgument);
  LlamaConfig sp = c;
  sp.sequence_parallel = true;
  EXPECT_THROW(sp.validate_sequence(15, 2), InvalidArgument);
  EXPECT_EQ(LlamaConfig{}.ffn(), 2048);  // 8 x 768 / 3 = 2048, a multiple of 256
  LlamaConfig w = c;
  w.hidden = 4096;
  w.ffn_hidden = 0;
  EXPECT_EQ(w.ffn(), 11008);  // Llama-7B's MLP width by the same rule
}

TEST(Llama, RotaryTablesMatchTheClosedForm) {
  LlamaConfig c = test_config();
  c.rope_theta = 500.0;
  const int64_t s = 12, d = c.dim_per_head();
  auto [cos, sin] = rotary_tables(c, s, c10::Device(c10::kCPU));
  ASSERT_EQ(cos.sizes(), (std::vector<int64_t>{s, d}));
  double worst = 0;
  for (int64_t p = 0; p < s; ++p) {
    for (int64_t j = 0; j < d; ++j) {
      const int64_t i = j % (d / 2);
      const double angle = static_cast<double>(p) * std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / d);
      worst = std::max(worst, std::abs(cos[p][j].item<double>() - std::cos(angle)));
      worst = std::max(worst, std::abs(sin[p][j].item<double>() - std::sin(angle)));
    }
  }
  EXPECT_LT(worst, 1e-5);  // f32 angles up to 11 rad

  // llama3 scaling, the rule per frequency in f64: wavelengths above
  // ctx / low are divided by factor, below ctx / high kept, blended between.
  LlamaConfig l3 = test_config();
  l3.head_dim = 64;
  l3.hidden = 256;
  l3.rope_theta = 500000.0;
  l3.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
  auto [cos3, sin3] = rotary_tables(l3, 40, c10::Device(c10::kCPU));
  int kept = 0, scaled = 0, blended = 0;
  worst = 0;
  for (int64_t i = 0; i < 32; ++i) {
    const double f = std::pow(500000.0, -2.0 * static_cast<double>(i) / 64);
    const double wl = 2 * std::numbers::pi / f;
    double g = f;
    if (wl < 64 / 4.0) {
      ++kept;
    } else if (wl > 64 / 1.0) {
      g = f / 8;
      ++scaled;
    } else {
      const double smooth = (64 / wl - 1.0) / (4.0 - 1.0);
      g = (1 - smooth) * f / 8 + smooth * f;
      ++blended;
    }
    const double angle = 39.0 * g;  // the last position
    worst = std::max(worst, std::abs(cos3[39][i].item<double>() - std::cos(angle)));
    worst = std::max(worst, std::abs(sin3[39][i + 32].item<double>() - std::sin(angle)));
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(blended, 0);
  EXPECT_LT(worst, 1e-4);  // f32 angles up to 39 rad

  // linear: every angle divided by the factor.
  LlamaConfig lin = test_config();
  lin.rope_scaling = {"linear", 4.0};
  auto [cos_lin, sin_lin] = rotary_tables(lin, 8, c10::Device(c10::kCPU));
  auto [cos_ref, sin_ref] = rotary_tables(test_config(), 32, c10::Device(c10::kCPU));
  EXPECT_LT((cos_lin[4] - cos_ref[1]).abs().max().item<double>(), 1e-6);  // position 4 / 4 = 1
  EXPECT_LT((sin_lin[4] - sin_ref[1]).abs().max().item<double>(), 1e-6);
  EXPECT_GT((sin_lin[4] - sin_ref[4]).abs().max().item<double>(), 0.1);  // and not unscaled
}

// The plain reference: the whole model from its named (full) parameters.
at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * (x * at::rsqrt(x.pow(2).mean({-1}, true) + eps));
}

at::Tensor reference_logits(const LlamaConfig& c, const std::map<std::string, at::Tensor>& p, const at::Tensor& tokens) {
  const int64_t b = tokens.size(0), s = tokens.size(1), d = c.dim_per_head(), H = c.num_heads, K = c.kv_heads();
  at::Tensor x = p.at("embedding.word.weight").index_select(0, tokens.reshape({-1})).view({b, s, c.hidden});
  // The angles in f32 whatever the model's dtype, as Hugging Face computes
  // them (inv_freq = 1 / theta^(2i/d), positions times inv_freq, cos and sin
  // in f32, then cast): the f64 model matches this to f64 rounding.
  at::Tensor pos = at::arange(s, at::kFloat);
  at::Tensor inv = 1.0 / at::pow(c.rope_theta, at::arange(0, d, 2, at::kFloat) / static_cast<double>(d));
  at::Tensor ang = at::outer(pos, inv);  // [s, d/2]
  auto rotate = [&](const at::Tensor& t) {  // t [b, heads, s, d]: pairs (i, i + d/2)
    at::Tensor t1 = t.narrow(-1, 0, d / 2), t2 = t.narrow(-1, d / 2, d / 2);
    at::Tensor co = ang.cos().to(t.scalar_type()), si = ang.sin().to(t.scalar_type());
    return at::cat({t1 * co - t2 * si, t2 * co + t1 * si}, -1);
  };
  at::Tensor causal = at::ones({s, s}, at::kBool).triu(1);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string pre = "blocks." + std::to_string(l) + ".";
    at::Tensor h = rms(x, p.at(pre + "attn_norm.weight"), c.rms_eps);
    at::Tensor q = at::matmul(h, p.at(pre + "q.weight").t()).view({b, s, H, d}).transpose(1, 2);
    at::Tensor k = at::matmul(h, p.at(pre + "k.weight").t()).view({b, s, K, d}).transpose(1, 2);
    at::Tensor v = at::matmul(h, p.at(pre + "v.weight").t()).view({b, s, K, d}).transpose(1, 2);
    q = rotate(q);
    k = rotate(k).repeat_interleave(H / K, 1);
    v = v.repeat_interleave(H / K, 1);
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
    at::Tensor probs = at::softmax(scores.masked_fill(causal, -std::numeric_limits<double>::infinity()), -1);
    at::Tensor ctx = at::matmul(probs, v).transpose(1, 2).reshape({b, s, H * d});
    x = x + at::matmul(ctx, p.at(pre + "o.weight").t());
    h = rms(x, p.at(pre + "mlp_norm.weight"), c.rms_eps);
    at::Tensor m = at::silu(at::matmul(h, p.at(pre + "gate.weight").t())) * at::matmul(h, p.at(pre + "up.weight").t());
    x = x + at::matmul(m, p.at(pre + "down.weight").t());
  }
  x = rms(x, p.at("head.norm.weight"), c.rms_eps);
  const at::Tensor& out = c.tie_embeddings ? p.at("embedding.word.weight") : p.at("head.output");
  return at::matmul(x, out.t());  // [b, s, V]
}

std::map<std::string, at::Tensor> named(const torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : m.named_parameters()) out[item.key()] = item.value().detach();
  return out;
}

void check_forward(const LlamaConfig& c, double tol) {
  Llama model(c);
  at::Tensor tokens = same_tokens({3, c.max_seq_len}, c.vocab_size, 7);
  at::Tensor got = model.forward(tokens).transpose(0, 1);  // [b, s, V]
  at::Tensor want = reference_logits(c, named(model), tokens);
  EXPECT_LE(rel_diff(got, want), tol) << "logits";
  // And the loss: the mean cross entropy of the same logits.
  at::Tensor labels = same_tokens({3, c.max_seq_len}, c.vocab_size, 8);
  const double loss = model.loss(tokens, labels).item<double>();
  const double want_loss =
      at::cross_entropy_loss(want.reshape({-1, c.vocab_size}).to(at::kDouble), labels.reshape({-1})).item<double>();
  EXPECT_NEAR(loss, want_loss, tol * std::abs(want_loss));
}

TEST(Llama, ForwardMatchesPlainReference) {
  check_forward(test_config(at::kDouble), 1e-12);
  check_forward(test_config(at::kFloat), 1e-5);
  LlamaConfig mha = test_config(at::kDouble);
  mha.num_kv_heads = 0;  // multi-head
  mha.tie_embeddings = true;
  check_forward(mha, 1e-12);
  LlamaConfig mqa = test_config(at::kDouble);
  mqa.num_kv_heads = 1;  // multi-query
  mqa.rope_theta = 100.0;
  check_forward(mqa, 1e-12);
}

TEST(Llama, BadInputFailsBeforeAnyCommunication) {
  LlamaConfig c = test_config();
  EXPECT_THROW(Llama(c, no_comm_tp(0, 3)), InvalidArgument);
  Llama model(c);
  at::Tensor bad = same_tokens({2, 16}, c.vocab_size, 1);
  bad[0][3] = c.vocab_size;
  EXPECT_THROW(model.forward(bad), InvalidArgument);
  EXPECT_THROW(model.forward(same_tokens({2, 17}, c.vocab_size, 1)), InvalidArgument);
  EXPECT_THROW(model.forward(bad.to(at::kInt)), InvalidArgument);
}

TEST(Llama, PipelinePartsComposeToTheWholeModel) {
  LlamaConfig c = test_config(at::kDouble);
  c.num_layers = 4;
  Llama whole(c);
  at::Tensor tokens = same_tokens({2, 16}, c.vocab_size, 3);
  at::Tensor want = whole.forward(tokens);
  const std::vector<DecoderPart> parts = llama_stage_parts(c, 3, 16, {1, 2, 1});
  at::Tensor x = tokens;
  for (const DecoderPart& part : parts) {
    Llama piece(c, {}, part);
    for (const auto& item : piece.named_parameters()) {
      // Same seeds: every piece holds the whole model's values.
      const std::string name = item.key() == "head.output" ? "head.output" : item.key();
      ASSERT_TRUE(named(whole).count(name)) << name;
      EXPECT_EQ(rel_diff(item.value(), named(whole).at(name)), 0) << name;
    }
    x = piece.forward(x);
  }
  EXPECT_LE(rel_diff(x, want), 1e-12);
  EXPECT_THROW(llama_stage_parts(c, 3, 16, {1, 1, 1}), InvalidArgument);  // sums to 3 of 4
}

TEST(Llama, ShardsAreSlicesOfTheSingleProcessWeights) {
  for (int n : {2, 4}) {  // tiny: 2 kv heads, split over 2 ranks, replicated over 4
    LlamaConfig c = test_config();
    const auto full = named(Llama(c));
    for (int r = 0; r < n; ++r) {
      Llama shard(c, no_comm_tp(r, n));
      const tp::ShardSpecs specs = tp::collect_shard_specs(shard);
      for (const auto& item : shard.named_parameters()) {
        const tp::ShardSpec& spec = specs.count(item.key()) ? specs.at(item.key()) : tp::ShardSpec{};
        at::Tensor want = full.at(item.key());
        if (spec.sharded()) {
          const int64_t rows = item.value().size(spec.dim);
          want = want.narrow(spec.dim, r * rows, std::min(rows, want.size(spec.dim) - r * rows));
        }
        EXPECT_EQ(rel_diff(item.value().narrow(0, 0, want.size(0)), want), 0) << item.key() << " tp" << n;
        const bool kv = item.key().find(".k.") != std::string::npos || item.key().find(".v.") != std::string::npos;
        if (kv) {
          EXPECT_EQ(spec.sharded(), n == 2) << item.key();
          EXPECT_EQ(spec.tp_partial_grad, n == 4) << item.key() << ": replicated kv heads have partial gradients";
        }
      }
    }
  }
}

TEST(LlamaModel, PresetsHaveTheirPublishedSizes) {
  run::RunConfig rc;
  rc.model = "llama-1b";
  rc.seq = 128;
  auto m = run::make_model(rc);
  EXPECT_EQ(m->name(), "llama");
  EXPECT_EQ(m->num_parameters(), 1235814400);  // Llama 3.2 1B (tied embeddings)
  rc.model = "gpt2";
  // GPT-2 124M has 124,439,808 parameters; the GPT drops the 12 x 768 key
  // biases, which softmax ignores (Note [QKV layout]).
  EXPECT_EQ(run::make_model(rc)->num_parameters(), 124439808 - 12 * 768);
  rc.model = "gpt2-medium";
  EXPECT_EQ(run::make_model(rc)->num_parameters(), 354823168 - 24 * 1024);
  rc.model = "llama-tiny";
  rc.layers = 3;  // an explicit option overrides the preset
  auto tiny = run::make_model(rc);
  EXPECT_NE(tiny->describe().find("3 layers"), std::string::npos) << tiny->describe();
  EXPECT_NE(tiny->config_json().find("\"num_kv_heads\":2"), std::string::npos) << tiny->config_json();
  rc.model = "llama-7b";
  EXPECT_THROW(run::make_model(rc), InvalidArgument);
  rc.model = "gpt";
  rc.layers = 0;
  rc.kv_heads = 2;
  EXPECT_THROW(run::make_model(rc), InvalidArgument);  // a Llama option on a GPT
}

TEST(LlamaModel, FlopsPerTokenMatchAHandCount) {
  LlamaConfig c = test_config();
  engine::LlamaModel m(c);
  const double h = 32, L = 2, d = 8, q = 32, kv = 16, f = 64, v = 61, s = 16;
  const double want = 6 * (L * (h * q + 2 * h * kv + q * h + 3 * h * f) + v * h) + 12 * L * q * s;
  EXPECT_DOUBLE_EQ(m.flops_per_token(16), want);
  (void)d;
  EXPECT_EQ(m.num_parameters(), [&] {
    int64_t n = 0;
    for (const auto& item : Llama(c).named_parameters()) n += item.value().numel();
    return n;
  }());
}

}  // namespace
}  // namespace torus::models
