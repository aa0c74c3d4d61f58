// Activation recompute in one process: recompute::run against plain
// autograd, the GPT under every policy against the same GPT without
// recompute (loss, every gradient, the random streams afterwards), the split
// backward of ZB-H1 through a replay, the end-of-backward callback rule, and
// policy parsing. Every expectation is the run without recompute, computed
// here; nothing is stored.
//
// Tolerances: a replay runs the same kernels on the same inputs, so its
// activations equal the original bit for bit; the gradients can differ only
// by the order in which autograd adds contributions (f32: 1e-6 relative,
// f64: 1e-12). In practice they are identical.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <string>
#include <vector>

#include "device/gpu_test_util.h"
#include "parallel/parallel_test_util.h"
#include "torus/models/gpt.h"
#include "torus/parallel/backward_callback.h"
#include "torus/parallel/tensor/random.h"
#include "torus/parallel/tensor/weight_grad.h"
#include "torus/recompute/recompute.h"

namespace torus::recompute {
namespace {

using testing::rel_diff;

// ---- Policy -------------------------------------------------------------------

TEST(RecomputePolicy, ParsesAndNames) {
  EXPECT_EQ(Policy::parse("none"), Policy::none());
  EXPECT_EQ(Policy::parse("full"), Policy::full());
  EXPECT_EQ(Policy::parse("selective"), Policy::selective());
  EXPECT_EQ(Policy::parse("every:1"), Policy::every(1));
  EXPECT_EQ(Policy::parse("every:12").every_k, 12);
  for (const char* s : {"none", "full", "every:1", "every:3", "every:100", "selective"}) {
    EXPECT_EQ(Policy::parse(s).name(), s);
    EXPECT_EQ(Policy::parse(Policy::parse(s).name()), Policy::parse(s));
  }
  EXPECT_FALSE(Policy{}.enabled());
  EXPECT_EQ(Policy{}, Policy::none());
}

TEST(RecomputePolicy, RejectsEverythingElse) {
  for (const char* s : {"", "None", "FULL", "every", "every:", "every:0", "every:-1", "every:2x", "every: 2",
                        "every:1.5", "every:99999999999999999999", "selective:1", "partial", "checkpoint", " full"}) {
    try {
      Policy::parse(s);
      ADD_FAILURE() << "'" << s << "' was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("recompute policy"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("every:K"), std::string::npos) << "names the accepted forms: " << e.what();
    }
  }
  EXPECT_THROW(Policy::every(0), InvalidArgument);
  EXPECT_THROW(Policy::every(-3), InvalidArgument);
  EXPECT_THROW((Policy{Policy::Kind::kEvery, 0}).validate(), InvalidArgument);
  EXPECT_THROW((Policy{Policy::Kind::kFull, 2}).validate(), InvalidArgument);
  EXPECT_THROW((Policy{static_cast<Policy::Kind>(17), 0}).validate(), InvalidArgument);
  models::GPTConfig config = models::GPTConfig::tiny();
  config.recompute = Policy{Policy::Kind::kEvery, 0};
  EXPECT_THROW(config.validate(1), InvalidArgument);
  EXPECT_THROW(models::GPT{config}, InvalidArgument);
}

TEST(RecomputePolicy, WhichBlocks) {
  const std::vector<std::pair<Policy, std::vector<bool>>> cases = {
      {Policy::none(), {false, false, false, false, false, false}},
      {Policy::full(), {true, true, true, true, true, true}},
      {Policy::every(1), {true, true, true, true, true, true}},
      {Policy::every(2), {true, false, true, false, true, false}},
      {Policy::every(4), {true, false, false, false, true, false}},
      {Policy::selective(), {false, false, false, false, false, false}},
  };
  for (const auto& [policy, expected] : cases) {
    for (int64_t l = 0; l < static_cast<int64_t>(expected.size()); ++l) {
      EXPECT_EQ(policy.recompute_block(l), expected[l]) << policy.name() << " layer " << l;
    }
    EXPECT_EQ(policy.recompute_attention_core(), policy == Policy::selective()) << policy.name();
  }
}

// ---- recompute::run ---------------------------------------------------------------

// y = dropout(tanh(x W^T) + noise) with the tracker's stream, noise from the
// CPU default generator: every random source the replay must restore.
struct Toy {
  std::shared_ptr<tp::RngTracker> rng = std::make_shared<tp::RngTracker>(7, 0);
  at::Tensor w = testing::same_randn({6, 5}, 3, at::kDouble).requires_grad_(true);
  int calls = 0;
  at::Tensor operator()(const at::Tensor& x) {
    ++calls;
    at::Tensor h = at::tanh(at::matmul(x, w.t()));
    h = h + 0.1 * at::randn_like(h);  // default CPU generator
    return tp::dropout(h, 0.3, true, rng->generator(tp::RngRegion::kReplicated));
  }
};

bool same_state(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && a.equal(b); }

at::Generator cpu_generator() { return at::detail::getDefaultCPUGenerator(); }

TEST(RecomputeRun, EqualsPlainAutogradAndRestoresEveryGenerator) {
  at::manual_seed(11);
  Toy plain, rec;
  at::Tensor x0 = testing::same_randn({4, 5}, 1, at::kDouble);
  at::Tensor xa = x0.clone().requires_grad_(true), xb = x0.clone().requires_grad_(true);
  at::Tensor dy = testing::same_randn({4, 6}, 2, at::kDouble);

  const at::Tensor cpu_before = cpu_generator().get_state();
  at::Tensor ya = plain(xa);
  // Draws after the forward: a later forward (next micro-batch) sees these.
  const at::Tensor next_a = at::randn({3}, at::kDouble);
  const tp::RngTracker::State rng_a = plain.rng->get_state();
  ya.backward(dy);

  cpu_generator().set_state(cpu_before);
  at::Tensor yb = run([&](const at::Tensor& x) { return rec(x); }, xb, {.rng_trackers = {rec.rng}});
  ASSERT_NE(yb.grad_fn(), nullptr);
  EXPECT_EQ(rec.calls, 1);
  const at::Tensor next_b = at::randn({3}, at::kDouble);
  const at::Tensor cpu_mid = cpu_generator().get_state();
  yb.backward(dy);
  EXPECT_EQ(rec.calls, 2) << "backward replays the function once";

  EXPECT_TRUE(ya.equal(yb));
  EXPECT_TRUE(next_a.equal(next_b));
  EXPECT_LE(rel_diff(xb.grad(), xa.grad()), 1e-14);
  EXPECT_LE(rel_diff(rec.w.grad(), plain.w.grad()), 1e-14);
  // After the replay every generator is where it was before it.
  EXPECT_TRUE(same_state(cpu_generator().get_state(), cpu_mid));
  const tp::RngTracker::State rng_b = rec.rng->get_state();
  EXPECT_TRUE(same_state(rng_a.replicated, rng_b.replicated));
  EXPECT_TRUE(same_state(rng_a.sharded, rng_b.sharded));
}

TEST(RecomputeRun, MultipleInputsSomeWithoutGrad) {
  at::Tensor a0 = testing::same_randn({3, 4}, 5, at::kDouble), b0 = testing::same_randn({3, 4}, 6, at::kDouble);
  at::Tensor w = testing::same_randn({4}, 7, at::kDouble).requires_grad_(true);
  auto fn = [&](const std::vector<at::Tensor>& in) { return at::sin(in[0] * in[1] * w); };
  at::Tensor a1 = a0.clone().requires_grad_(true);
  fn({a1, b0}).sum().backward();
  const at::Tensor ga = a1.grad().clone(), gw = w.grad().clone();
  w.mutable_grad() = at::Tensor();
  at::Tensor a2 = a0.clone().requires_grad_(true), b2 = b0.clone();
  run(fn, {a2, b2}).sum().backward();
  EXPECT_LE(rel_diff(a2.grad(), ga), 1e-15);
  EXPECT_LE(rel_diff(w.grad(), gw), 1e-15);
  EXPECT_FALSE(b2.grad().defined());
}

// With no input requiring grad, the parameters inside still get gradients.
TEST(RecomputeRun, NoInputRequiresGrad) {
  at::Tensor x = testing::same_randn({3, 4}, 8, at::kDouble);
  at::Tensor w = testing::same_randn({4}, 9, at::kDouble).requires_grad_(true);
  auto fn = [&](const at::Tensor& in) { return at::exp(in * w); };
  fn(x).sum().backward();
  const at::Tensor gw = w.grad().clone();
  w.mutable_grad() = at::Tensor();
  at::Tensor y = run(fn, x);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_LE(rel_diff(w.grad(), gw), 1e-15);
}

TEST(RecomputeRun, WithoutGradModeJustCalls) {
  int calls = 0;
  at::Tensor w = testing::same_randn({4}, 9).requires_grad_(true);
  at::NoGradGuard no_grad;
  at::Tensor y = run(
      [&](const at::Tensor& in) {
        ++calls;
        return in * w;
      },
      testing::same_randn({4}, 1));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
}

TEST(RecomputeRun, RejectsBadArguments) {
  at::Tensor x = testing::same_randn({2}, 1);
  EXPECT_THROW(run(Function(), x), InvalidArgument);
  EXPECT_THROW(run([](const at::Tensor& t) { return t; }, at::Tensor()), InvalidArgument);
  EXPECT_THROW(run([](const at::Tensor& t) { return t; }, x, {.rng_trackers = {nullptr}}), InvalidArgument);
  EXPECT_THROW(run(MultiFunction([](const std::vector<at::Tensor>& t) { return t[0]; }), {}), InvalidArgument);
}

// The replay runs under the forward's autocast, not the backward's.
TEST(RecomputeRun, ReplaysUnderTheForwardsAutocast) {
  at::Tensor w = testing::same_randn({8, 8}, 4).requires_grad_(true);
  at::Tensor x0 = testing::same_randn({4, 8}, 5);
  std::vector<at::ScalarType> seen;
  auto fn = [&](const at::Tensor& in) {
    at::Tensor y = at::matmul(in, w);
    seen.push_back(y.scalar_type());
    return y.to(at::kFloat);
  };
  at::Tensor x1 = x0.clone().requires_grad_(true), x2 = x0.clone().requires_grad_(true);
  at::Tensor y1, y2;
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    y1 = fn(x1);
    y2 = run(fn, x2);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  y1.sum().backward();
  const at::Tensor gw = w.grad().clone();
  w.mutable_grad() = at::Tensor();
  y2.sum().backward();  // autocast is off here
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], at::kBFloat16);
  EXPECT_EQ(seen[2], at::kBFloat16) << "the replay ran without the forward's autocast";
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "the replay left autocast on";
  EXPECT_TRUE(y1.equal(y2));
  EXPECT_LE(rel_diff(w.grad(), gw), 0.0);
  EXPECT_LE(rel_diff(x2.grad(), x1.grad()), 0.0);
}

// ---- Note [Inner backward] ---------------------------------------------------------

// A callback queued from a hook that fires inside a recompute's inner
// backward runs when the OUTER backward ends — after the gradients produced
// later in the outer pass — not when the inner pass ends.
TEST(InnerBackward, CallbacksRunAfterTheOuterBackward) {
  for (bool rule : {true, false}) {
    std::vector<std::string> events;
    at::Tensor first = testing::same_randn({3}, 1).requires_grad_(true);  // used first: its gradient comes last
    at::Tensor inner = testing::same_randn({3}, 2).requires_grad_(true);  // used inside the recompute
    first.register_hook([&](const at::Tensor& g) {
      events.push_back("first");
      return g;
    });
    inner.register_hook([&](const at::Tensor& g) {
      if (events.empty()) {
        auto cb = [&] { events.push_back("end of backward"); };
        if (rule) {
          parallel::queue_after_backward(cb);
        } else {
          torch::autograd::Engine::get_default_engine().queue_callback(cb);
        }
      }
      events.push_back("inner");
      return g;
    });
    at::Tensor h = first * 2;
    at::Tensor y = run([&](const at::Tensor& x) { return x * inner; }, h);
    y.sum().backward();
    EXPECT_EQ(parallel::inner_backward_depth(), 0);
    if (rule) {
      EXPECT_EQ(events, (std::vector<std::string>{"inner", "first", "end of backward"}));
    } else {
      // What the rule prevents: the engine's callback ends the inner pass.
      EXPECT_EQ(events, (std::vector<std::string>{"inner", "end of backward", "first"}));
    }
  }
}

// ---- the GPT under every policy --------------------------------------------------

models::GPTConfig dropout_config(at::ScalarType dtype) {
  models::GPTConfig c = models::GPTConfig::tiny();
  c.num_layers = 4;
  c.dropout = 0.1;
  c.attention_dropout = 0.1;
  c.dtype = dtype;
  return c;
}

struct Step {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
  tp::RngTracker::State rng;
  double next_loss = 0;  // a second forward: sees the streams the first left
};

Step gpt_step(models::GPTConfig config, const Policy& policy) {
  config.recompute = policy;
  models::GPT model(config);
  model.train();
  const int64_t s = config.max_seq_len;
  at::Tensor data = testing::same_tokens({3, s + 1}, config.vocab_size, 21);
  at::Tensor x = data.narrow(1, 0, s).contiguous(), y = data.narrow(1, 1, s).contiguous();
  Step out;
  at::Tensor loss = model.loss(x, y);
  loss.backward();
  out.loss = loss.item<double>();
  for (const auto& item : model.named_parameters()) {
    EXPECT_TRUE(item.value().grad().defined()) << policy.name() << ": no gradient for " << item.key();
    out.grads[item.key()] = item.value().grad().clone();
  }
  out.rng = model.rng()->get_state();
  at::NoGradGuard no_grad;
  out.next_loss = model.loss(x, y).item<double>();
  return out;
}

void check_policies(at::ScalarType dtype, double tol) {
  const models::GPTConfig config = dropout_config(dtype);
  const Step ref = gpt_step(config, Policy::none());
  for (const Policy& policy : {Policy::full(), Policy::every(2), Policy::every(3), Policy::selective()}) {
    const Step got = gpt_step(config, policy);
    EXPECT_LE(std::abs(got.loss - ref.loss), tol * std::abs(ref.loss)) << policy.name();
    EXPECT_EQ(got.next_loss, ref.next_loss) << policy.name() << ": later steps see other masks";
    double worst = 0;
    for (const auto& [name, g] : ref.grads) {
      ASSERT_TRUE(got.grads.count(name)) << name;
      const double d = rel_diff(got.grads.at(name), g);
      worst = std::max(worst, d);
      EXPECT_LE(d, tol) << policy.name() << " " << name;
    }
    EXPECT_TRUE(same_state(got.rng.replicated, ref.rng.replicated)) << policy.name();
    EXPECT_TRUE(same_state(got.rng.sharded, ref.rng.sharded)) << policy.name();
    std::printf("[recompute] %-9s %s: loss %.8f vs %.8f, worst gradient difference %.2e\n", policy.name().c_str(),
                c10::toString(dtype), got.loss, ref.loss, worst);
  }
}

TEST(RecomputeGPT, EveryPolicyMatchesNoRecomputeFloat32) { check_policies(at::kFloat, 1e-6); }
TEST(RecomputeGPT, EveryPolicyMatchesNoRecomputeFloat64) { check_policies(at::kDouble, 1e-12); }

// Dropout really is on: a different seed for the streams changes the loss
// (so the equalities above are about the masks, not their absence).
TEST(RecomputeGPT, DropoutIsActive) {
  models::GPTConfig config = dropout_config(at::kDouble);
  const Step a = gpt_step(config, Policy::full());
  models::GPTConfig no_dropout = config;
  no_dropout.dropout = no_dropout.attention_dropout = 0;
  const Step b = gpt_step(no_dropout, Policy::full());
  EXPECT_NE(a.loss, b.loss);
}

// Note [Deferred weight gradients] through a replay: forward under deferral,
// backward under a store (the BI pass), flush (the BW pass) — equals the
// fused backward without recompute. The replay records the linears of every
// recomputed block into the store of the pass that runs it.
TEST(RecomputeGPT, SplitBackwardThroughReplay) {
  const models::GPTConfig base = dropout_config(at::kDouble);
  const int64_t s = base.max_seq_len;
  at::Tensor data = testing::same_tokens({2, s + 1}, base.vocab_size, 5);
  at::Tensor x = data.narrow(1, 0, s).contiguous(), y = data.narrow(1, 1, s).contiguous();
  models::GPT fused(base);
  fused.train();
  fused.loss(x, y).backward();
  auto ref = fused.named_parameters();
  for (const Policy& policy : {Policy::full(), Policy::every(2), Policy::selective()}) {
    models::GPTConfig config = base;
    config.recompute = policy;
    models::GPT split(config);
    split.train();
    tp::WeightGradStore store;
    at::Tensor loss;
    {
      tp::DeferWeightGradGuard defer;
      loss = split.loss(x, y);
    }
    {
      tp::WeightGradStoreGuard guard(&store);
      loss.backward();
    }
    EXPECT_EQ(store.size(), static_cast<size_t>(4 * config.num_layers)) << policy.name();
    EXPECT_FALSE(tp::weight_grad_deferral_enabled());
    for (const auto& item : split.named_parameters()) {
      if (item.key().find("qkv.weight") != std::string::npos) {
        EXPECT_FALSE(item.value().grad().defined()) << policy.name() << " " << item.key() << " not deferred";
      }
    }
    store.flush();
    for (const auto& item : split.named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_LE(rel_diff(item.value().grad(), ref[item.key()].grad()), 1e-12) << policy.name() << " " << item.key();
    }
  }
}

// Evaluation (no grad) runs every block once, with or without a policy.
TEST(RecomputeGPT, EvaluationIsUnchanged) {
  models::GPTConfig config = dropout_config(at::kFloat);
  const int64_t s = config.max_seq_len;
  at::Tensor data = testing::same_tokens({2, s + 1}, config.vocab_size, 6);
  at::Tensor x = data.narrow(1, 0, s).contiguous(), y = data.narrow(1, 1, s).contiguous();
  models::GPT plain(config);
  config.recompute = Policy::full();
  models::GPT rec(config);
  plain.eval();
  rec.eval();
  at::NoGradGuard no_grad;
  EXPECT_TRUE(plain.loss(x, y).equal(rec.loss(x, y)));
}

// ---- CUDA (skips without a GPU) ----------------------------------------------------

// On CUDA the default generator restored is the device's; the GPT's masks
// come from its CUDA RngTracker streams. Tolerance 1e-5: CUDA's embedding
// backward adds with atomics, in no fixed order.
TEST(RecomputeCuda, GeneratorsAndGPTOnTheDevice) {
  TORUS_REQUIRE_ACCELERATOR();
  const c10::Device dev(c10::kCUDA, 0);
  at::Tensor w = testing::same_randn({6, 5}, 3).to(dev).requires_grad_(true);
  auto fn = [&](const at::Tensor& x) { return at::tanh(at::matmul(x, w.t())) * at::rand_like(x.narrow(1, 0, 1)); };
  at::Tensor x0 = testing::same_randn({4, 5}, 1).to(dev);
  at::Generator cuda_gen = at::globalContext().defaultGenerator(dev);
  const at::Tensor start = cuda_gen.get_state();
  at::Tensor xa = x0.clone().requires_grad_(true);
  at::Tensor ya = fn(xa);
  ya.sum().backward();
  const at::Tensor ga = w.grad().clone(), next_a = at::rand({3}, at::TensorOptions().device(dev));
  w.mutable_grad() = at::Tensor();
  cuda_gen.set_state(start);
  at::Tensor xb = x0.clone().requires_grad_(true);
  at::Tensor yb = run(fn, xb);
  const at::Tensor mid = cuda_gen.get_state();
  yb.sum().backward();
  EXPECT_TRUE(same_state(cuda_gen.get_state(), mid)) << "the CUDA generator was not put back after the replay";
  EXPECT_TRUE(ya.equal(yb));
  EXPECT_TRUE(next_a.equal(at::rand({3}, at::TensorOptions().device(dev))));
  EXPECT_LE(rel_diff(w.grad(), ga), 1e-6);
  EXPECT_LE(rel_diff(xb.grad(), xa.grad()), 1e-6);

  models::GPTConfig config = dropout_config(at::kFloat);
  config.device = dev;
  auto step = [&](const Policy& policy) {
    models::GPTConfig c = config;
    c.recompute = policy;
    models::GPT model(c);
    model.train();
    const int64_t s = c.max_seq_len;
    at::Tensor data = testing::same_tokens({3, s + 1}, c.vocab_size, 21).to(dev);
    model.loss(data.narrow(1, 0, s).contiguous(), data.narrow(1, 1, s).contiguous()).backward();
    std::map<std::string, at::Tensor> g;
    for (const auto& item : model.named_parameters()) g[item.key()] = item.value().grad().cpu();
    return g;
  };
  const auto ref = step(Policy::none());
  for (const Policy& policy : {Policy::full(), Policy::every(2), Policy::selective()}) {
    const auto got = step(policy);
    for (const auto& [name, g] : ref) EXPECT_LE(rel_diff(got.at(name), g), 1e-5) << policy.name() << " " << name;
  }
}

}  // namespace
}  // namespace torus::recompute
