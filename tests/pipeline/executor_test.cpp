// Multi-rank tests of the pipeline executor on a toy model: a chain of
// tanh(x W^T + b) layers in f64, cut into p*v stages over p ranks (mpirun).
// Every schedule — GPipe, 1F1B, interleaved 1F1B, ZB-H1 — must give the
// gradients (within 1e-12) and losses of the same chain run in one process
// with autograd, summed over micro-batches; with shapes declared or agreed on
// first use; over two steps with one executor. Invalid schedules are refused
// on every rank before any communication.
#include "torus/parallel/pipeline/executor.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "torus/comm/process_group.h"
#include "torus/core/error.h"

namespace torus::pp {
namespace {

const comm::ProcessGroupPtr& world() {
  static comm::ProcessGroupPtr w = torus::init();
  return w;
}

constexpr int64_t kBatch = 3;
constexpr int64_t kWidth = 5;
constexpr int kLayersPerStage = 2;

// The whole chain, identical on every rank (a closed formula, no RNG).
struct Chain {
  std::vector<at::Tensor> weight, bias;  // per global layer
  explicit Chain(int num_layers) {
    for (int l = 0; l < num_layers; ++l) {
      at::Tensor i = at::arange(kWidth * kWidth, at::kDouble).reshape({kWidth, kWidth});
      weight.push_back((i * 0.37 + l).sin() * (1.2 / std::sqrt(double(kWidth))));
      bias.push_back((at::arange(kWidth, at::kDouble) * 0.91 - l).cos() * 0.1);
    }
  }
  static at::Tensor input(int micro) {
    return (at::arange(kBatch * kWidth, at::kDouble).reshape({kBatch, kWidth}) * 0.53 + micro).sin();
  }
};

// d(sum over micro-batches of 0.5 |y_m|^2) by autograd over the whole chain.
struct Reference {
  std::vector<at::Tensor> grad_weight, grad_bias;
  std::vector<double> losses;
};
Reference reference(const Chain& chain, int num_micro) {
  std::vector<at::Tensor> w, b;
  for (size_t l = 0; l < chain.weight.size(); ++l) {
    w.push_back(chain.weight[l].clone().set_requires_grad(true));
    b.push_back(chain.bias[l].clone().set_requires_grad(true));
  }
  Reference ref;
  at::Tensor total = at::zeros({}, at::kDouble);
  for (int mb = 0; mb < num_micro; ++mb) {
    at::Tensor x = Chain::input(mb);
    for (size_t l = 0; l < w.size(); ++l) x = at::tanh(at::matmul(x, w[l].t()) + b[l]);
    at::Tensor loss = 0.5 * (x * x).sum();
    ref.losses.push_back(loss.item<double>());
    total = total + loss;
  }
  total.backward();
  for (size_t l = 0; l < w.size(); ++l) {
    ref.grad_weight.push_back(w[l].grad());
    ref.grad_bias.push_back(b[l].grad());
  }
  return ref;
}

// One rank's chunks of the chain, with the backward written out by hand so
// that input and weight gradients are separate steps (for ZB-H1).
class ToyStage : public StageCallbacks {
 public:
  ToyStage(const Chain& chain, const Schedule& s, int rank) : chain_(chain), s_(s), rank_(rank) {
    for (size_t l = 0; l < chain.weight.size(); ++l) {
      grad_weight.push_back(at::zeros_like(chain.weight[l]));
      grad_bias.push_back(at::zeros_like(chain.bias[l]));
    }
  }

  at::Tensor forward(int micro, int chunk, const at::Tensor& input) override {
    const int stage = s_.stage(rank_, chunk);
    EXPECT_EQ(input.defined(), stage != 0);
    Saved& sv = saved_[{micro, chunk}];
    at::Tensor x = stage == 0 ? Chain::input(micro) : input;
    for (int l : layers(chunk)) {
      sv.x.push_back(x);
      x = at::tanh(at::matmul(x, chain_.weight[l].t()) + chain_.bias[l]);
      sv.y.push_back(x);
    }
    return x;
  }

  at::Tensor loss(int micro, const at::Tensor& output) override { return 0.5 * (output * output).sum(); }

  at::Tensor backward_input(int micro, int chunk, const at::Tensor& grad_output) override {
    Saved& sv = saved_.at({micro, chunk});
    EXPECT_TRUE(sv.dz.empty()) << "backward twice";
    at::Tensor g = grad_output.defined() ? grad_output : sv.y.back();  // d(0.5|y|^2)/dy = y
    auto ls = layers(chunk);
    sv.dz.resize(ls.size());
    for (int i = int(ls.size()) - 1; i >= 0; --i) {
      at::Tensor dz = g * (1 - sv.y[i] * sv.y[i]);
      sv.dz[i] = dz;
      g = at::matmul(dz, chain_.weight[ls[i]]);
    }
    return g;
  }

  void backward_weight(int micro, int chunk) override {
    Saved& sv = saved_.at({micro, chunk});
    EXPECT_FALSE(sv.dz.empty()) << "weight gradient before input gradient";
    auto ls = layers(chunk);
    for (size_t i = 0; i < ls.size(); ++i) {
      grad_weight[ls[i]] += at::matmul(sv.dz[i].t(), sv.x[i]);
      grad_bias[ls[i]] += sv.dz[i].sum(0);
    }
    saved_.erase({micro, chunk});
  }

  std::vector<int> layers(int chunk) const {
    std::vector<int> out;
    const int stage = s_.stage(rank_, chunk);
    for (int l = stage * kLayersPerStage; l < (stage + 1) * kLayersPerStage; ++l) out.push_back(l);
    return out;
  }
  bool drained() const { return saved_.empty(); }

  std::vector<at::Tensor> grad_weight, grad_bias;  // per global layer; only this rank's are touched

 private:
  struct Saved {
    std::vector<at::Tensor> x, y, dz;
  };
  const Chain& chain_;
  const Schedule& s_;
  const int rank_;
  std::map<std::pair<int, int>, Saved> saved_;
};

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

std::vector<Schedule> schedules_for(int p) {
  std::vector<Schedule> out;
  for (int m : {p, 2 * p + 1}) {
    out.push_back(gpipe(p, m));
    out.push_back(one_f_one_b(p, m));
    out.push_back(zero_bubble_h1(p, m));
  }
  if (p >= 2) {
    out.push_back(interleaved_1f1b(p, p, 2));
    out.push_back(interleaved_1f1b(p, 2 * p, 2));
    out.push_back(interleaved_1f1b(p, 2 * p, 3));
  }
  return out;
}

void run_and_compare(const Schedule& s, const ExecutorOptions& options) {
  const auto& g = world();
  const int rank = g->rank();
  SCOPED_TRACE(s.describe());
  Chain chain(s.num_stages() * kLayersPerStage);
  Reference ref = reference(chain, s.num_micro);
  ToyStage stage(chain, s, rank);
  PipelineExecutor exec(g, options);
  constexpr int kSteps = 2;  // the second step reuses the agreed shapes and the tags
  StepResult result;
  for (int step = 0; step < kSteps; ++step) result = exec.run(s, stage);
  EXPECT_TRUE(stage.drained());

  Simulation sim = simulate(s);
  EXPECT_EQ(result.peak_live, sim.ranks[rank].peak_live);
  EXPECT_GT(result.busy, 0.0);
  EXPECT_GE(result.wall, result.busy);
  if (options.record_trace) {
    ASSERT_EQ(result.trace.size(), s.actions[rank].size());
    for (size_t i = 0; i < result.trace.size(); ++i) EXPECT_EQ(result.trace[i].action, s.actions[rank][i]);
  }

  for (int c = 0; c < s.num_chunks; ++c) {
    for (int l : stage.layers(c)) {
      EXPECT_LE(max_abs_diff(stage.grad_weight[l], kSteps * ref.grad_weight[l]), 1e-12) << "layer " << l;
      EXPECT_LE(max_abs_diff(stage.grad_bias[l], kSteps * ref.grad_bias[l]), 1e-12) << "layer " << l;
    }
  }
  if (rank == s.num_ranks - 1) {
    ASSERT_EQ(result.losses.size(), size_t(s.num_micro));
    for (int mb = 0; mb < s.num_micro; ++mb) {
      EXPECT_NEAR(result.losses[mb].item<double>(), ref.losses[mb], 1e-12) << "micro-batch " << mb;
    }
  } else {
    EXPECT_TRUE(result.losses.empty());
  }
}

TEST(PipelineExecutor, EveryScheduleMatchesOneProcessWithShapesAgreedOnFirstUse) {
  ExecutorOptions options;
  options.record_trace = true;
  for (const Schedule& s : schedules_for(world()->size())) run_and_compare(s, options);
}

TEST(PipelineExecutor, EveryScheduleMatchesOneProcessWithDeclaredShapes) {
  ExecutorOptions options;
  options.edge_specs = {TensorSpec{{kBatch, kWidth}, at::kDouble}};
  options.recv_prefetch = 0;  // receives posted only when reached
  for (const Schedule& s : schedules_for(world()->size())) run_and_compare(s, options);
}

TEST(PipelineExecutor, InvalidSchedulesAreRefusedBeforeAnyCommunication) {
  const auto& g = world();
  const int p = g->size();
  Chain chain(p * kLayersPerStage);
  PipelineExecutor exec(g);
  // Sized for another group.
  Schedule other = one_f_one_b(p + 1, 2);
  ToyStage stage_other(chain, other, g->rank());
  EXPECT_THROW(exec.run(other, stage_other), InvalidArgument);
  if (p >= 2) {
    // Rank 0 waits for the gradient of micro-batch 0 before doing anything.
    Schedule s = one_f_one_b(p, 2);
    s.name = "deadlock";
    auto& r0 = s.actions[0];
    auto rg = std::find_if(r0.begin(), r0.end(), [](const Action& a) { return a.kind == ActionKind::kRecvGrad; });
    std::rotate(r0.begin(), rg, rg + 1);
    ToyStage stage(chain, s, g->rank());
    try {
      exec.run(s, stage);
      ADD_FAILURE() << "a deadlocking schedule must be refused";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0, action #0 RecvGrad(micro 0, chunk 0, from rank 1)"),
                std::string::npos)
          << e.what();
    }
  }
  // Nothing was sent: the group and the executor still work, in step on every rank.
  run_and_compare(one_f_one_b(p, p), {});
}

}  // namespace
}  // namespace torus::pp
