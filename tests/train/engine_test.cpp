// Single-process parts of the training engine: the GPT's model FLOPs against
// a hand count of its matmuls, the peak table, the CPU GEMM measurement, the
// forward-only schedule, and the model registry.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include "torus/core/error.h"
#include "torus/parallel/pipeline/schedule.h"
#include "torus/engine/gpt_model.h"
#include "torus/engine/model.h"
#include "torus/run/peak_flops.h"
#include "torus/run/run_config.h"
#include "torus/run/registry.h"

namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

// Multiply-adds of one token's forward, matmul by matmul, at sequence s:
// QKV [h -> 3h], attention scores (s keys of width h over all heads),
// probabilities x V (s values of width h), projection [h -> h], fc1 [h -> f],
// fc2 [f -> h] per block, then the output layer [h -> V]. A forward costs 2
// FLOPs per multiply-add and the backward twice the forward.
double hand_count(int64_t L, int64_t h, int64_t f, int64_t V, int64_t s) {
  const double qkv = h * 3.0 * h, scores = 1.0 * s * h, values = 1.0 * s * h, proj = 1.0 * h * h;
  const double fc1 = 1.0 * h * f, fc2 = 1.0 * f * h, out = 1.0 * h * V;
  const double mac_forward = L * (qkv + scores + values + proj + fc1 + fc2) + out;
  return 3 * 2 * mac_forward;
}

TEST(ModelFlops, GPTMatchesHandCount) {
  for (auto [L, h, f, V, s] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{2, 32, 0, 61, 16},
                               {4, 128, 512, 256, 128},
                               {12, 768, 0, 50257, 1024},
                               {3, 64, 100, 256, 7}}) {
    models::GPTConfig c;
    c.num_layers = L;
    c.hidden = h;
    c.num_heads = 4;
    c.ffn_hidden = f;
    c.vocab_size = V;
    c.max_seq_len = std::max<int64_t>(s, 16);
    GPTModel m(c);
    const int64_t ffn = f > 0 ? f : 4 * h;
    EXPECT_DOUBLE_EQ(m.flops_per_token(s), hand_count(L, h, ffn, V, s)) << "L=" << L << " h=" << h;
  }
}

TEST(ModelFlops, ParameterCountMatchesTheModule) {
  // num_parameters() by formula against the parameters of the built
  // single-process module (one stage holds them all).
  for (bool tied : {true, false}) {
    models::GPTConfig c = models::GPTConfig::tiny();
    c.tie_embeddings = tied;
    GPTModel m(c);
    ModelLayout layout;
    auto stage = m.build_stage(0, layout, {});
    int64_t n = 0;
    for (const auto& p : stage->parameters()) n += p.tensor.numel();
    EXPECT_EQ(m.num_parameters(), n) << "tied " << tied;
  }
}

TEST(PeakFlops, CudaTable) {
  EXPECT_DOUBLE_EQ(cuda_dense_peak_flops("NVIDIA H100 80GB HBM3", at::kBFloat16), 989.4e12);
  EXPECT_DOUBLE_EQ(cuda_dense_peak_flops("NVIDIA H100 PCIe", at::kHalf), 756e12);
  EXPECT_DOUBLE_EQ(cuda_dense_peak_flops("NVIDIA H200", at::kFloat), 66.9e12);
  EXPECT_DOUBLE_EQ(cuda_dense_peak_flops("NVIDIA A100-SXM4-40GB", at::kBFloat16), 312e12);
  EXPECT_DOUBLE_EQ(cuda_dense_peak_flops("Tesla V100-SXM2-16GB", at::kBFloat16), 0.0);  // no bf16 tensor cores
  EXPECT_DOUBLE_EQ(cuda_dense_peak_flops("Some GPU", at::kBFloat16), 0.0);
}

TEST(PeakFlops, CpuGemmMeasurement) {
  // A real measurement: above 0.1 GFLOP/s on any machine this runs on.
  const double flops = measure_cpu_gemm_flops(at::kFloat, 1, 256);
  EXPECT_GT(flops, 1e8);
  EXPECT_THROW(measure_cpu_gemm_flops(at::kFloat, 0), InvalidArgument);
}

TEST(ForwardOnlySchedule, ValidAndWithoutBackward) {
  for (auto [p, m, v] : {std::tuple<int, int, int>{1, 3, 1}, {2, 4, 1}, {4, 2, 1}, {2, 4, 2}, {3, 6, 2}}) {
    const pp::Schedule s = pp::forward_only(p, m, v);
    EXPECT_TRUE(s.forward_only);
    const pp::Simulation sim = pp::simulate(s);
    EXPECT_TRUE(sim.ok()) << (sim.issues.empty() ? "" : sim.issues[0].message);
    int forwards = 0;
    for (const auto& rank : s.actions) {
      for (const auto& a : rank) {
        EXPECT_TRUE(a.kind == pp::ActionKind::kForward || a.kind == pp::ActionKind::kSendActivation ||
                    a.kind == pp::ActionKind::kRecvActivation);
        forwards += a.kind == pp::ActionKind::kForward;
      }
    }
    EXPECT_EQ(forwards, p * m * v);
  }
  // A backward in a forward-only schedule is an issue; a training schedule
  // without its backwards is one too.
  pp::Schedule bad = pp::gpipe(2, 2);
  bad.forward_only = true;
  EXPECT_FALSE(pp::simulate(bad).ok());
  pp::Schedule missing = pp::forward_only(2, 2);
  missing.forward_only = false;
  EXPECT_FALSE(pp::simulate(missing).ok());
}

TEST(ModelRegistry, FromRunConfig) {
  RunConfig c;
  c.layers = 3;
  c.hidden = 48;
  c.heads = 4;
  c.seq = 32;
  c.precision = "bf16";
  auto m = make_model(c);
  EXPECT_EQ(m->name(), "gpt");
  EXPECT_EQ(m->param_dtype(), at::kBFloat16);
  const auto& g = static_cast<const GPTModel&>(*m).config();
  EXPECT_EQ(g.num_layers, 3);
  EXPECT_EQ(g.hidden, 48);
  EXPECT_EQ(g.vocab_size, 256);
  EXPECT_EQ(g.max_seq_len, 32);
  c.model = "llama9";
  EXPECT_THROW(make_model(c), InvalidArgument);
}

TEST(GPTModel, StagesNamesTiesAndRngStreams) {
  models::GPTConfig c = models::GPTConfig::tiny();
  c.dropout = 0.1;
  GPTModel m(c);
  ModelLayout layout;
  layout.num_stages = 2;
  EXPECT_EQ(m.describe_stages(layout).size(), 2u);
  auto first = m.build_stage(0, layout, {});
  auto last = m.build_stage(1, layout, {});
  auto find = [](const StageModule& s, const std::string& name) {
    for (const auto& p : s.parameters()) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << "no parameter " << name;
    return StageParameter{};
  };
  const StageParameter owner = find(*first, "embedding.word.weight");
  const StageParameter copy = find(*last, "head.output");
  EXPECT_EQ(owner.tie_key, copy.tie_key);
  EXPECT_FALSE(owner.tie_key.empty());
  EXPECT_FALSE(owner.tie_copy);
  EXPECT_TRUE(copy.tie_copy);
  EXPECT_TRUE(owner.weight_decay);
  EXPECT_FALSE(find(*first, "blocks.0.ln1.weight").weight_decay);
  // Different stages draw different dropout streams (RngTracker's stage).
  const auto a = first->rng_state(), b = last->rng_state();
  EXPECT_FALSE(at::equal(a.at("replicated"), b.at("replicated")));
  // Setting a state back restores it exactly.
  last->set_rng_state(a);
  EXPECT_TRUE(at::equal(last->rng_state().at("replicated"), a.at("replicated")));
  EXPECT_EQ(first->block_layers(), std::vector<int64_t>{0});
  EXPECT_EQ(last->block_layers(), std::vector<int64_t>{1});
}

}  // namespace
}  // namespace torus::train_test
