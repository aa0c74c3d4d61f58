// Activation recompute across ranks (mpirun, 2 ranks): tensor parallelism
// with and without sequence parallelism, and DDP with finish_in_backward.
// Each rank compares a run with recompute against the same run without it,
// in the same layout; the replay issues the forward's collectives again,
// so every rank must replay in step.
//
// Tolerance: f32 1e-6 relative, as in one process (the replay is bitwise
// identical; only the order of gradient additions could differ).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "parallel/parallel_test_util.h"
#include "torus/models/gpt.h"
#include "torus/parallel/data/ddp.h"
#include "torus/recompute/recompute.h"

namespace torus::recompute {
namespace {

using testing::world;

const std::vector<Policy>& policies() {
  static const std::vector<Policy> p = {Policy::full(), Policy::every(2), Policy::selective()};
  return p;
}

models::GPTConfig dropout_config() {
  models::GPTConfig c = models::GPTConfig::tiny();
  c.num_layers = 4;
  c.dropout = 0.1;
  c.attention_dropout = 0.1;
  return c;
}

struct Grads {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
};

// One forward and backward of the whole GPT in a tp layout (every rank the
// same tokens): the local shards' gradients, not reduced.
Grads tp_step(models::GPTConfig config, const Policy& policy, bool sp) {
  const auto& groups = testing::mesh_groups(1, world()->size());
  config.recompute = policy;
  config.sequence_parallel = sp;
  models::GPT model(config, groups);
  model.train();
  const int64_t s = config.max_seq_len;
  at::Tensor data = testing::same_tokens({4, s + 1}, config.vocab_size, 31);
  at::Tensor loss = model.loss(data.narrow(1, 0, s).contiguous(), data.narrow(1, 1, s).contiguous());
  loss.backward();
  Grads out;
  out.loss = loss.item<double>();
  for (const auto& item : model.named_parameters()) out.grads[item.key()] = item.value().grad().clone();
  return out;
}

void check_tp(bool sp) {
  ASSERT_EQ(world()->size(), 2);
  const models::GPTConfig config = dropout_config();
  const Grads ref = tp_step(config, Policy::none(), sp);
  for (const Policy& policy : policies()) {
    const Grads got = tp_step(config, policy, sp);
    EXPECT_LE(std::abs(got.loss - ref.loss), 1e-6 * std::abs(ref.loss)) << policy.name();
    double worst = 0;
    for (const auto& [name, g] : ref.grads) {
      ASSERT_TRUE(got.grads.at(name).defined()) << name;
      const double d = testing::rel_diff(got.grads.at(name), g);
      worst = std::max(worst, d);
      EXPECT_LE(d, 1e-6) << policy.name() << " " << name;
    }
    if (world()->rank() == 0) {
      std::printf("[recompute] tp2%s %-9s: loss %.8f vs %.8f, worst gradient difference %.2e\n", sp ? ",sp" : "",
                  policy.name().c_str(), got.loss, ref.loss, worst);
    }
  }
}

TEST(RecomputeTP, Tp2GradientsMatch) { check_tp(false); }
TEST(RecomputeTP, Tp2SequenceParallelGradientsMatch) { check_tp(true); }

// ---- DDP, finish_in_backward -----------------------------------------------------

struct DdpRun {
  std::map<std::string, at::Tensor> grads;
  int64_t syncs = 0;
};

// dp2, each rank its own rows. `with_head`: the whole GPT and its loss; else
// the model without the head and a fixed linear functional of its output,
// so that the first gradient of the backward arrives inside the last
// block's recompute (the case where a callback queued on the inner backward
// would finish every bucket too early).
DdpRun ddp_step(const Policy& policy, bool with_head, bool average) {
  const auto& groups = testing::mesh_groups(world()->size(), 1);
  models::GPTConfig config = dropout_config();
  config.recompute = policy;
  models::GPTPart part;
  part.head = with_head;
  auto model = std::make_shared<models::GPT>(config, groups, part);
  model->train();
  dp::DDPOptions o;
  o.bucket_cap_bytes = 16 << 10;  // several buckets, started from hooks
  o.first_bucket_cap_bytes = 4 << 10;
  o.finish_in_backward = true;
  o.average = average;
  dp::DistributedDataParallel ddp(model, groups, o);
  const int64_t s = config.max_seq_len;
  at::Tensor data = testing::same_tokens({2, s + 1}, config.vocab_size, 40 + groups.dp_rank());
  at::Tensor x = data.narrow(1, 0, s).contiguous();
  at::Tensor loss;
  if (with_head) {
    loss = model->loss(x, data.narrow(1, 1, s).contiguous());
  } else {
    at::Tensor h = model->forward(x);
    loss = (h * testing::same_randn(h.sizes(), 41 + groups.dp_rank())).sum();
  }
  loss.backward();  // the buckets finish when this returns
  DdpRun out;
  for (const auto& item : model->named_parameters()) out.grads[item.key()] = item.value().grad().clone();
  out.syncs = ddp.stats().syncs;
  return out;
}

TEST(RecomputeDDP, FinishInBackwardWaitsForTheOuterBackward) {
  ASSERT_EQ(world()->size(), 2);
  for (bool with_head : {false, true}) {
    for (bool average : {false, true}) {
      const DdpRun ref = ddp_step(Policy::none(), with_head, average);
      EXPECT_EQ(ref.syncs, 1);
      for (const Policy& policy : policies()) {
        const DdpRun got = ddp_step(policy, with_head, average);
        const std::string what =
            policy.name() + (with_head ? " with head" : " without head") + (average ? ", average" : ", sum");
        EXPECT_EQ(got.syncs, 1) << what << ": the buckets finished more than once in one backward";
        double worst = 0;
        for (const auto& [name, g] : ref.grads) {
          const double d = testing::rel_diff(got.grads.at(name), g);
          worst = std::max(worst, d);
          EXPECT_LE(d, 1e-6) << what << " " << name;
        }
        if (world()->rank() == 0) {
          std::printf("[recompute] dp2 %-28s: %lld sync(s), worst gradient difference %.2e\n", what.c_str(),
                      static_cast<long long>(got.syncs), worst);
        }
      }
    }
  }
}

}  // namespace
}  // namespace torus::recompute
