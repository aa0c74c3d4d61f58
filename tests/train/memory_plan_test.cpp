// The memory estimate and pre-check (memory_plan.h, Note [Memory estimate])
// against closed forms written here from the GPT's dimensions, and the
// options TrainLoop builds the engine with (train_loop.h).
#include "torus/engine/memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "torus/core/error.h"
#include "torus/parallel/data/zero.h"
#include "torus/recompute/recompute.h"
#include "torus/engine/gpt_model.h"
#include "torus/run/metrics.h"
#include "torus/run/run_config.h"
#include "torus/run/train_loop.h"
#include "torus/run/registry.h"

namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

// The test model: vocabulary 256, 64 positions, 4 blocks of width 64 with 4
// heads and an MLP of 256, tied embeddings.
constexpr int64_t V = 256, S = 64, L = 4, H = 64, A = 4, F = 256;
// Micro-batches of b rows of s tokens.
constexpr int64_t kRows = 2, kSeq = 64;

models::GPTConfig gpt(c10::ScalarType dtype) {
  models::GPTConfig g;
  g.vocab_size = V;
  g.max_seq_len = S;
  g.num_layers = L;
  g.hidden = H;
  g.num_heads = A;
  g.ffn_hidden = F;
  g.tie_embeddings = true;
  g.dtype = dtype;
  return g;
}

// Parameters of one block, counted piece by piece: two LayerNorms (gain,
// bias), QKV (3h x h weight; the fused bias as the model has it, 2h), the
// projection (h x h + h), fc1 (f x h + f), fc2 (h x f + h).
constexpr int64_t kBlock = 2 * (2 * H) + (3 * H * H + 2 * H) + (H * H + H) + (F * H + F) + (H * F + H);
// Outside the blocks: word and position embeddings, the final LayerNorm.
constexpr int64_t kOutside = V * H + S * H + 2 * H;
constexpr int64_t kPsi = L * kBlock + kOutside;

int64_t up(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Korthikanti et al.: s b h (34 + 5 a s / h) bytes per block at 16 bits
// (here 5 a s / h = 20 exactly).
constexpr int64_t kBlockAct16 = kSeq * kRows * H * (34 + 5 * A * kSeq / H);
constexpr int64_t kLogits = 8 * kSeq * kRows * V;  // f32 logits and their gradient

ParallelLayout layout(int dp, int pp = 1, int tp = 1, bool sp = false) {
  ParallelLayout l;
  l.dp = dp;
  l.pp = pp;
  l.tp = tp;
  l.sequence_parallel = sp;
  l.num_micro = 4;
  return l;
}

// ZeRO of an estimate: the layout's stage and offload, the options' prefetch.
struct Zero {
  int stage = 0;
  dp::Offload offload = dp::Offload::kNone;
  TrainerOptions options;
};
Zero zero(int stage, dp::Offload offload = dp::Offload::kNone, int prefetch = 1) {
  Zero z{stage, offload, {}};
  z.options.zero_prefetch = prefetch;
  return z;
}
MemoryEstimate estimate(const Model& model, ParallelLayout l, const Zero& z, int64_t rows, int64_t seq,
                        const OptimizerConfig& optim = {}) {
  l.zero = z.stage;
  l.offload = z.offload;
  return estimate_memory(model, l, z.options, rows, seq, optim);
}

TEST(MemoryEstimate, ParameterCountIsTheModels) {
  const GPTModel model(gpt(at::kBFloat16));
  ASSERT_EQ(model.num_parameters(), kPsi);  // the hand count is the model's
  const MemoryEstimate e = estimate(model, layout(1), zero(0), kRows, kSeq);
  EXPECT_EQ(e.parameters, 2 * kPsi);
}

// bf16 parameters, AdamW: P = 2, G = 4 (f32 main gradients), K = 12 (f32
// master, m, v), at N = 2 and 4, stages 0-3, pp = tp = 1.
TEST(MemoryEstimate, ZeroStagesBf16Adam) {
  const GPTModel model(gpt(at::kBFloat16));
  const int64_t act = L * kBlockAct16 + kLogits;  // 1F1B at pp = 1: one micro-batch alive
  for (int n : {2, 4}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const MemoryEstimate s0 = estimate(model, layout(n), zero(0), kRows, kSeq);
    EXPECT_EQ(s0.parameters, 2 * kPsi);
    EXPECT_EQ(s0.gradients, 4 * kPsi);
    EXPECT_EQ(s0.optimizer, 12 * kPsi);
    EXPECT_EQ(s0.activations, act);
    EXPECT_EQ(s0.buffers, 0);
    EXPECT_EQ(s0.host_bytes(), 0);

    const MemoryEstimate s1 = estimate(model, layout(n), zero(1), kRows, kSeq);
    EXPECT_EQ(s1.parameters, 2 * kPsi);
    EXPECT_EQ(s1.gradients, 4 * kPsi);
    EXPECT_EQ(s1.optimizer, 12 * up(kPsi, n));
    EXPECT_EQ(s1.buffers, 4 * up(kPsi, n));  // the reduced f32 gradient shard beside the full gradient

    const MemoryEstimate s2 = estimate(model, layout(n), zero(2), kRows, kSeq);
    EXPECT_EQ(s2.parameters, 2 * kPsi);
    EXPECT_EQ(s2.gradients, 4 * up(kPsi, n));
    EXPECT_EQ(s2.optimizer, 12 * up(kPsi, n));
    EXPECT_EQ(s2.buffers, 2 * 4 * kBlock);  // two transient f32 block gradient buffers

    const MemoryEstimate s3 = estimate(model, layout(n), zero(3), kRows, kSeq);
    EXPECT_EQ(s3.parameters, 2 * up(L * kBlock, n) + 2 * kOutside);  // block shards; the rest stays gathered
    EXPECT_EQ(s3.gradients, 4 * up(kPsi, n));
    EXPECT_EQ(s3.optimizer, 12 * up(kPsi, n));
    EXPECT_EQ(s3.buffers, (1 + 1) * 2 * kBlock + 2 * 4 * kBlock);  // running + prefetched block, 2 gradient buffers
    EXPECT_EQ(s3.activations, act);
    // Stage 3 saves P Ψ_b (1 - 1/N) and gathers (1 + prefetch) blocks: on
    // 4 blocks at N = 2 that is a wash (2 x 4 / 2 = 4 blocks' bf16 bytes each way).
    if (n == 2) {
      EXPECT_EQ(s3.device_bytes(), s2.device_bytes());
    } else {
      EXPECT_LT(s3.device_bytes(), s2.device_bytes());
    }
    EXPECT_LT(s2.device_bytes(), s1.device_bytes());
    EXPECT_LT(s1.device_bytes(), s0.device_bytes());

    const MemoryEstimate p3 = estimate(model, layout(n), zero(3, dp::Offload::kNone, 3), kRows, kSeq);
    EXPECT_EQ(p3.buffers, (1 + 3) * 2 * kBlock + 2 * 4 * kBlock);
  }
}

TEST(MemoryEstimate, Offload) {
  const GPTModel model(gpt(at::kBFloat16));
  const MemoryEstimate o1 = estimate(model, layout(4), zero(1, dp::Offload::kOptimizer), kRows, kSeq);
  EXPECT_EQ(o1.optimizer, 0);
  EXPECT_EQ(o1.host_optimizer, 12 * up(kPsi, 4));
  EXPECT_EQ(o1.host_parameters, 0);
  const MemoryEstimate o3 = estimate(model, layout(4), zero(3, dp::Offload::kOptimizerAndParams), kRows, kSeq);
  EXPECT_EQ(o3.optimizer, 0);
  EXPECT_EQ(o3.host_optimizer, 12 * up(kPsi, 4));
  EXPECT_EQ(o3.parameters, 2 * kOutside);
  EXPECT_EQ(o3.host_parameters, 2 * up(L * kBlock, 4));
  EXPECT_EQ(o3.host_bytes(), o3.host_optimizer + o3.host_parameters);
}

// f32 parameters: P = G = 4, Adam K = 8 (m, v), SGD with momentum K = 4,
// plain SGD 0, f32 activations (twice the 16-bit bytes); bf16 gradients in
// the parameter dtype: G = 2.
TEST(MemoryEstimate, DtypesAndOptimizers) {
  const GPTModel f32(gpt(at::kFloat));
  const MemoryEstimate adam = estimate(f32, layout(2), zero(0), kRows, kSeq);
  EXPECT_EQ(adam.parameters, 4 * kPsi);
  EXPECT_EQ(adam.gradients, 4 * kPsi);
  EXPECT_EQ(adam.optimizer, 8 * kPsi);
  EXPECT_EQ(adam.activations, 2 * L * kBlockAct16 + kLogits);
  OptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.momentum = 0.9;
  EXPECT_EQ(estimate(f32, layout(2), zero(0), kRows, kSeq, sgd).optimizer, 4 * kPsi);
  EXPECT_EQ(estimate(f32, layout(2), zero(2), kRows, kSeq, sgd).optimizer, 4 * up(kPsi, 2));
  sgd.momentum = 0;
  EXPECT_EQ(estimate(f32, layout(2), zero(0), kRows, kSeq, sgd).optimizer, 0);

  const GPTModel bf16(gpt(at::kBFloat16));
  Zero param_grads = zero(2);
  param_grads.options.grads_in_param_dtype = true;
  const MemoryEstimate g2 = estimate(bf16, layout(4), param_grads, kRows, kSeq);
  EXPECT_EQ(g2.gradients, 2 * up(kPsi, 4));
  EXPECT_EQ(g2.buffers, 2 * 2 * kBlock);
  sgd.momentum = 0.9;
  EXPECT_EQ(estimate(bf16, layout(2), zero(0), kRows, kSeq, sgd).optimizer, 8 * kPsi);  // master + momentum
}

// Tensor parallelism with SP: parameters and activations of a block / t;
// the word embedding / t, the position embedding and norms whole.
TEST(MemoryEstimate, TensorParallelSequenceParallel) {
  const GPTModel model(gpt(at::kBFloat16));
  const int64_t psi = L * up(kBlock, 2) + (V * H / 2 + S * H) + 2 * H;
  const MemoryEstimate e = estimate(model, layout(2, 1, 2, true), zero(0), kRows, kSeq);
  EXPECT_EQ(e.parameters, 2 * psi);
  EXPECT_EQ(e.activations, L * kBlockAct16 / 2 + kLogits / 2);
  // Without SP: s b h (10 + 24 / t + 5 a s / (h t)) = s b h (10 + 12 + 10).
  const MemoryEstimate n = estimate(model, layout(2, 1, 2, false), zero(0), kRows, kSeq);
  EXPECT_EQ(n.activations, L * kSeq * kRows * H * 32 + kLogits / 2);
}

// 1F1B at pp = 2 (two blocks per stage): stage 0 holds 2 micro-batches
// (the embedding and blocks 0-1), stage 1 one (blocks 2-3, the final norm,
// the head: a copy of the tied word embedding, and the logits); the
// estimate is the fuller rank's.
TEST(MemoryEstimate, PipelineStagesAndRecompute) {
  const GPTModel model(gpt(at::kBFloat16));
  ParallelLayout l = layout(2, 2);
  l.layers_per_stage = {2, 2};
  const int64_t psi0 = 2 * kBlock + V * H + S * H;
  const int64_t psi1 = 2 * kBlock + 2 * H + V * H;
  const int64_t act0 = 2 * 2 * kBlockAct16;
  const int64_t act1 = 1 * 2 * kBlockAct16 + kLogits;
  const int64_t total0 = (2 + 4 + 12) * psi0 + act0, total1 = (2 + 4 + 12) * psi1 + act1;
  const MemoryEstimate e = estimate(model, l, zero(0), kRows, kSeq);
  ASSERT_NE(total0, total1);
  EXPECT_EQ(e.device_bytes(), std::max(total0, total1));
  EXPECT_EQ(e.activations, total0 > total1 ? act0 : act1);

  // GPipe keeps all 4 micro-batches on both.
  l.schedule = pp::ScheduleKind::kGPipe;
  const MemoryEstimate g = estimate(model, l, zero(0), kRows, kSeq);
  const int64_t g0 = 18 * psi0 + 4 * 2 * kBlockAct16, g1 = 18 * psi1 + 4 * (2 * kBlockAct16 + kLogits);
  EXPECT_EQ(g.device_bytes(), std::max(g0, g1));

  // Full recompute: each block keeps its input (2 s b h at 16 bits), plus
  // one block's activations while it is recomputed.
  models::GPTConfig full = gpt(at::kBFloat16);
  full.recompute = recompute::Policy::full();
  const GPTModel rmodel(full);
  const MemoryEstimate r = estimate(rmodel, layout(2), zero(0), kRows, kSeq);
  EXPECT_EQ(r.activations, L * 2 * kSeq * kRows * H + kBlockAct16 + kLogits);
  // Selective: without the attention term, 34 s b h per block.
  models::GPTConfig sel = gpt(at::kBFloat16);
  sel.recompute = recompute::Policy::selective();
  EXPECT_EQ(estimate(GPTModel(sel), layout(2), zero(0), kRows, kSeq).activations,
            L * 34 * kSeq * kRows * H + kLogits);
}

TEST(MemoryCheck, RefusesWhatDoesNotFitUnlessForced) {
  const GPTModel model(gpt(at::kBFloat16));
  const MemoryEstimate e = estimate(model, layout(2), zero(0), kRows, kSeq);
  MemoryBudget fits{e.device_bytes(), e.device_bytes(), true};
  EXPECT_TRUE(check_memory(e, fits, false));
  MemoryBudget small{e.device_bytes() - 1, 1LL << 40, true};
  try {
    check_memory(e, small, false);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& err) {
    const std::string what = err.what();
    for (const char* word : {"memory pre-check", "per rank", "parameters", "optimizer", "activations", "--zero",
                             "--offload", "--force"}) {
      EXPECT_NE(what.find(word), std::string::npos) << word << " not in: " << what;
    }
    EXPECT_NE(what.find(format_bytes(static_cast<double>(small.device))), std::string::npos) << what;
  }
  EXPECT_FALSE(check_memory(e, small, true));  // --force: a warning only

  // A device budget: device bytes against the device, offloaded ones against the host.
  const MemoryEstimate o = estimate(model, layout(2), zero(1, dp::Offload::kOptimizer), kRows, kSeq);
  EXPECT_TRUE(check_memory(o, MemoryBudget{o.device_bytes(), o.host_bytes(), false}, false));
  EXPECT_THROW(check_memory(o, MemoryBudget{o.device_bytes(), o.host_bytes() - 1, false}, false), InvalidArgument);
  EXPECT_THROW(check_memory(o, MemoryBudget{o.device_bytes() - 1, o.host_bytes(), false}, false), InvalidArgument);
  // On the host the offloaded bytes are the same pool.
  EXPECT_THROW(check_memory(o, MemoryBudget{o.device_bytes(), 1LL << 40, true}, false), InvalidArgument);
}

// The pre-check TrainLoop runs, from a RunConfig: refused below the
// estimate, --force passes, and --zero 1 fits where --zero 0 did not.
TEST(MemoryCheck, PrecheckFromRunConfig) {
  RunConfig c;
  c.layers = 4;
  c.hidden = 64;
  c.heads = 4;
  c.seq = 64;
  c.batch = 16;
  c.layout.num_micro = 4;
  c.precision = "bf16";
  const auto model = make_model(c);
  ParallelLayout l = run_layout(c, 2);  // dp = 2
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(run_micro_batch_rows(c, l), 2);
  const MemoryEstimate e = precheck_memory(c, *model, l, MemoryBudget{1LL << 40, 1LL << 40, true});
  EXPECT_EQ(e.optimizer, 12 * model->num_parameters());
  const MemoryBudget tight{e.device_bytes() - 1, 1LL << 40, true};
  EXPECT_THROW(precheck_memory(c, *model, l, tight), InvalidArgument);
  c.force = true;
  EXPECT_NO_THROW(precheck_memory(c, *model, l, tight));
  c.force = false;
  c.layout.zero = 1;
  l = run_layout(c, 2);
  EXPECT_NO_THROW(precheck_memory(c, *model, l, tight));
}

TEST(MemoryBudget, MeminfoAndHost) {
  EXPECT_EQ(parse_mem_available("MemTotal:       16000 kB\nMemFree:  100 kB\nMemAvailable:    2048 kB\n"),
            2048 * 1024);
  EXPECT_EQ(parse_mem_available("MemTotal: 1 kB\n"), -1);
  const MemoryBudget one = available_memory_per_rank(c10::Device(c10::kCPU), 1);
  const MemoryBudget four = available_memory_per_rank(c10::Device(c10::kCPU), 4);
  EXPECT_TRUE(one.device_is_host);
  EXPECT_GT(one.host, 0);
  EXPECT_EQ(one.device, one.host);
  // A quarter of the host each (MemAvailable moves between the reads).
  EXPECT_NEAR(static_cast<double>(four.host), one.host / 4.0, one.host * 0.05);
}

TEST(TrainLoopOptions, ZeroOptionsReachTheTrainer) {
  RunConfig c;
  parse_run_config(std::vector<std::string>{"--zero", "3", "--offload", "optimizer+params", "--zero-prefetch", "2",
                                            "--grad-dtype", "param"},
                   c);
  c.validate();
  const TrainerOptions o = run_trainer_options(c);
  EXPECT_EQ(run_layout(c, 1).zero, 3);
  EXPECT_EQ(run_layout(c, 1).offload, dp::Offload::kOptimizerAndParams);
  EXPECT_EQ(o.zero_prefetch, 2);
  EXPECT_TRUE(o.grads_in_param_dtype);
  const TrainerOptions d = run_trainer_options(RunConfig{});
  EXPECT_EQ(run_layout(RunConfig{}, 1).zero, 0);
  EXPECT_EQ(run_layout(RunConfig{}, 1).offload, dp::Offload::kNone);
  EXPECT_EQ(d.zero_prefetch, 1);
  c.optimizer = "sgd";
  c.momentum = 0.5;
  EXPECT_EQ(run_optimizer(c).name, "sgd");
  EXPECT_DOUBLE_EQ(run_optimizer(c).momentum, 0.5);
  EXPECT_EQ(run_layout(c, 3).dp, 3);  // dp 0: the rest of the world
  c.layout.tp = 2;
  EXPECT_THROW(run_layout(c, 3), InvalidArgument);  // tp 2 does not divide 3 ranks
}

TEST(Offload, Names) {
  for (dp::Offload o : {dp::Offload::kNone, dp::Offload::kOptimizer, dp::Offload::kOptimizerAndParams}) {
    EXPECT_EQ(dp::parse_offload(dp::offload_name(o)), o);
  }
  EXPECT_EQ(dp::offload_name(dp::Offload::kOptimizerAndParams), "optimizer+params");
  try {
    dp::parse_offload("gpu");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("none, optimizer, optimizer+params"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gpu"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace torus::train_test
