// The MoE GPT trained through the training loop in expert-parallel layouts
// against the same model trained by one process, in the same job (every rank
// runs the single-process reference on a group of its own): the losses of 20
// steps within 1e-5 relative (f32; 1e-4 after a routing near-tie, see
// expect_same), the routing statistics of every step —
// tokens per expert, drops (up to near-ties that f32 rounding flips),
// auxiliary and z losses — the same, in dropless mode and with a capacity
// factor that drops tokens. (The drop policy itself is checked token for
// token against a plain reference in moe_test.cpp.) A checkpoint saved at ep2
// resumes at ep4 and at ep1 with the losses of the uninterrupted run; one
// saved with experts split over TP (--expert-tp) resumes at ep4 and at tp2.
// The world size picks the cases (tests.cmake runs np2, np4 and np6).
#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"
#include "parallel/parallel_test_util.h"
#include "support/job_dir.h"
#include "torus/parallel/expert/moe.h"
#include "torus/parallel/tensor/random.h"
#include "torus/parallel/tensor/sharding.h"
#include "torus/run/train_loop.h"

namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

namespace fs = std::filesystem;
using testing::world;

std::string job_dir(const std::string& name) { return testing::job_dir("torus_moe_job", name); }

RunConfig moe_config(const std::string& out, double capacity_factor) {
  RunConfig c;
  c.layers = 4;
  c.hidden = 32;
  c.heads = 4;
  c.seq = 16;
  c.batch = 8;
  c.layout.num_micro = 2;
  c.steps = 20;
  c.warmup = 2;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.eval_interval = 0;
  c.eval_batches = 1;
  c.tensorboard = false;
  c.progress = "off";
  c.peak_tflops = 1;
  c.threads = 1;
  c.moe_every = 2;  // blocks 1 and 3
  c.experts = 4;
  c.top_k = 2;
  c.capacity_factor = capacity_factor;
  c.aux_loss_weight = 0.01;
  c.z_loss_weight = 1e-3;
  c.out = out;
  return c;
}

struct LoopRun {
  std::vector<double> losses;
  std::vector<ep::RoutingSummary> routing;
  int64_t first_step = 0;
};

LoopRun run_loop(const comm::ProcessGroupPtr& group, const RunConfig& c) {
  TrainLoop loop(group, c, "test");
  loop.set_line_sink([](std::string_view) {});
  LoopRun r;
  loop.on_step([&](const StepRecord& rec) {
    if (r.losses.empty()) r.first_step = rec.step;
    r.losses.push_back(rec.loss);
    r.routing.push_back(rec.routing);
  });
  loop.run();
  return r;
}

// The single-process run of `c` (layout reset), on a group of this rank only.
LoopRun reference(RunConfig c, const std::string& dir) {
  static comm::ProcessGroupPtr self = world()->split(world()->rank(), 0, "self");
  c.layout.tp = c.layout.pp = c.layout.ep = 1;
  c.layout.dp = 0;
  c.layout.sequence_parallel = false;
  c.layout.zero = 0;
  c.layout.schedule = pp::ScheduleKind::k1F1B;
  c.out = dir + "/ref-" + std::to_string(world()->rank());
  return run_loop(self, c);
}

constexpr double kNearTies = 2;

void expect_same(const LoopRun& ref, const LoopRun& got, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.first_step, ref.first_step);
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  // Routing is a step function of f32 scores: a near-tie that the layouts'
  // summation orders resolve differently sends one assignment elsewhere, and
  // from that step on the two runs follow neighbouring trajectories of the
  // same model (such a flip moved a loss by 1.2e-5 relative). Losses are
  // held to 1e-5 while every layer's routing is identical, to 1e-4 after
  // the first step whose routing differs, and at least 15 of the 20 steps
  // must route identically.
  bool same_routing = true;
  size_t identical_steps = 0;
  for (size_t k = 0; k < ref.losses.size(); ++k) {
    const auto& a = ref.routing[k];
    const auto& b = got.routing[k];
    for (size_t l = 0; l < a.layers.size() && l < b.layers.size(); ++l) {
      same_routing = same_routing && a.layers[l].tokens_per_expert == b.layers[l].tokens_per_expert &&
                     a.layers[l].dropped == b.layers[l].dropped;
    }
    if (same_routing) ++identical_steps;
    EXPECT_NEAR(got.losses[k], ref.losses[k], (same_routing ? 1e-5 : 1e-4) * std::abs(ref.losses[k]))
        << "step " << k + 1 << (same_routing ? "" : " (after a routing near-tie)");
    ASSERT_EQ(a.layers.size(), 2u) << "two MoE layers report";
    ASSERT_EQ(b.layers.size(), a.layers.size()) << "step " << k + 1;
    for (size_t l = 0; l < a.layers.size(); ++l) {
      EXPECT_EQ(b.layers[l].layer, a.layers[l].layer);
      // Routing is discontinuous: a token whose two best experts score within
      // f32 rounding of each other (the layouts sum in other orders) may flip.
      // Such near-ties are rare; allow two assignments per expert and step.
      ASSERT_EQ(b.layers[l].tokens_per_expert.size(), a.layers[l].tokens_per_expert.size());
      for (size_t e = 0; e < a.layers[l].tokens_per_expert.size(); ++e) {
        EXPECT_LE(std::abs(b.layers[l].tokens_per_expert[e] - a.layers[l].tokens_per_expert[e]), kNearTies)
            << "step " << k + 1 << " layer " << l << " expert " << e;
      }
      EXPECT_LE(std::abs(b.layers[l].dropped - a.layers[l].dropped), kNearTies) << "step " << k + 1 << " layer " << l;
      const double stat_tol = same_routing ? 1e-4 : 1e-3;
      EXPECT_NEAR(b.layers[l].aux_loss, a.layers[l].aux_loss, stat_tol * a.layers[l].aux_loss);
      EXPECT_NEAR(b.layers[l].z_loss, a.layers[l].z_loss, stat_tol * a.layers[l].z_loss);
    }
  }
  EXPECT_GE(identical_steps, std::min<size_t>(15, ref.losses.size())) << "routing differed from step "
                                                                      << identical_steps + 1;
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the reference did not train";
}

struct Layout {
  int tp = 1, pp = 1, ep = 1, zero = 0;
  bool sp = false;
  bool expert_tp = false;  // experts split over TP (Note [Expert tensor parallelism])
  std::string schedule = "1f1b";
  std::string name;
};

void check_layouts(const std::vector<Layout>& layouts, int64_t batch = 8) {
  const std::string dir = job_dir("layouts");
  for (double cf : {0.0, 1.0}) {
    RunConfig base = moe_config(dir, cf);
    base.batch = batch;
    const LoopRun ref = reference(base, dir);
    if (cf > 0) {
      double dropped = 0;
      for (const auto& r : ref.routing) dropped += r.drop_rate();
      EXPECT_GT(dropped, 0) << "capacity 1.0 drops tokens";
    } else {
      for (const auto& r : ref.routing) EXPECT_EQ(r.drop_rate(), 0.0);
    }
    for (const Layout& l : layouts) {
      RunConfig c = base;
      c.out = dir + "/" + l.name + "-" + std::to_string(cf);
      c.layout.tp = l.tp;
      c.layout.pp = l.pp;
      c.layout.ep = l.ep;
      c.layout.sequence_parallel = l.sp;
      c.layout.zero = l.zero;
      c.layout.schedule = pp::schedule_kind_from_name(l.schedule);
      c.layout.expert_tp = l.expert_tp;
      expect_same(ref, run_loop(world(), c), fmt::format("{}, capacity factor {}", l.name, cf));
    }
  }
}

TEST(MoELayouts, TwoRanks) {
  ASSERT_EQ(world()->size(), 2);
  check_layouts({{.ep = 2, .name = "ep2"},
                 {.ep = 2, .zero = 2, .name = "ep2 zero2"},
                 {.tp = 2, .expert_tp = true, .name = "tp2 expert-tp"}});
}

// With --expert-tp each TP rank holds a 1/tp block of every expert weight
// (fc1 rows and bias, fc2 columns; fc2's bias whole): the blocks of the TP
// ranks, put together, are the whole experts of the unsplit layer.
TEST(MoELayouts, ExpertTpSplitsTheExperts) {
  ASSERT_EQ(world()->size(), 2);
  const parallel::ParallelGroups& g = testing::mesh_groups(1, 2);
  ep::MoEConfig c;
  c.num_experts = 4;
  c.top_k = 2;
  c.hidden = 8;
  c.ffn_hidden = 12;
  auto make = [&](bool split) {
    ep::MoEConfig x = c;
    x.expert_tensor_parallel = split;
    return std::make_shared<ep::MoELayer>(x, "blocks.1.moe", 1, g, false, std::make_shared<tp::RngTracker>(7, 0));
  };
  auto whole = make(false), split = make(true);
  const tp::ShardSpecs specs = tp::collect_shard_specs(*split);
  int64_t whole_numel = 0, split_numel = 0;
  for (const auto& item : whole->named_parameters()) whole_numel += item.value().numel();
  for (const auto& item : split->named_parameters()) split_numel += item.value().numel();
  // Per expert: fc1 12x8 + 12, fc2 8x12 + 8; the router 4x8 stays whole.
  EXPECT_EQ(whole_numel, 4 * 8 + 4 * (96 + 12 + 96 + 8));
  EXPECT_EQ(split_numel, 4 * 8 + 4 * (48 + 6 + 48 + 8));
  const auto full = tp::gather_full_parameters(*split, g.tp);
  for (const auto& item : whole->named_parameters()) {
    SCOPED_TRACE(item.key());
    ASSERT_TRUE(full.count(item.key()));
    EXPECT_TRUE(at::equal(full.at(item.key()), item.value())) << "the TP blocks are not the whole expert";
  }
  EXPECT_EQ(specs.at("experts.0.fc1.weight").dim, 0);
  EXPECT_EQ(specs.at("experts.0.fc1.bias").dim, 0);
  EXPECT_EQ(specs.at("experts.0.fc2.weight").dim, 1);
  EXPECT_FALSE(specs.at("experts.0.fc2.bias").sharded());
  EXPECT_TRUE(specs.at("experts.0.fc2.bias").tp_partial_grad);
}

// An expert width that tp does not divide is refused while the model is
// built, on every rank, before any step communicates.
TEST(MoELayouts, ExpertTpNeedsDivisibleWidth) {
  ASSERT_EQ(world()->size(), 2);
  RunConfig c = moe_config(job_dir("bad-width"), 0.0);
  c.layout.tp = 2;
  c.layout.expert_tp = true;
  c.moe_ffn = 33;
  try {
    TrainLoop loop(world(), c, "test");
    loop.set_line_sink([](std::string_view) {});
    loop.run();
    FAIL() << "an expert width of 33 over tp=2 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide"), std::string::npos) << e.what();
  }
}

TEST(MoELayouts, FourRanks) {
  ASSERT_EQ(world()->size(), 4);
  check_layouts({{.ep = 4, .name = "ep4"},
                 {.ep = 2, .name = "ep2 dp2"},
                 {.ep = 2, .zero = 1, .name = "ep2 dp2 zero1"},
                 {.tp = 2, .ep = 2, .name = "tp2 ep2"},
                 {.tp = 2, .ep = 2, .sp = true, .name = "tp2 ep2 sp"},
                 {.tp = 2, .ep = 2, .expert_tp = true, .name = "tp2 ep2 expert-tp"},
                 {.tp = 2, .ep = 2, .zero = 2, .sp = true, .expert_tp = true, .name = "tp2 ep2 sp expert-tp zero2"},
                 {.pp = 2, .ep = 2, .name = "pp2 ep2 1f1b"},
                 {.pp = 2, .ep = 2, .schedule = "zb-h1", .name = "pp2 ep2 zb-h1"}});
}

TEST(MoELayouts, SixRanks) {
  ASSERT_EQ(world()->size(), 6);
  check_layouts({{.pp = 3, .ep = 2, .name = "pp3 ep2"},
                 {.tp = 1, .ep = 2, .zero = 3, .name = "dp3 ep2 zero3"},
                 {.tp = 2, .pp = 3, .expert_tp = true, .name = "tp2 pp3 expert-tp"}},
                /*batch=*/12);
}

TEST(MoECheckpoint, SavedAtEp2ResumesAtEp4AndEp1) {
  ASSERT_EQ(world()->size(), 4);
  const std::string dir = job_dir("ckpt");
  RunConfig a = moe_config(dir + "/a", 1.0);
  a.layout.ep = 2;  // dp2 x ep2
  a.steps = 12;
  a.save_every = 6;
  const LoopRun ref = run_loop(world(), a);
  ASSERT_EQ(ref.losses.size(), 12u);
  const std::string step6 = (fs::path(a.checkpoint_dir()) / "step-00000006").string();
  for (int ep : {4, 1}) {
    RunConfig b = a;
    b.layout.ep = ep;
    b.out = dir + "/ep" + std::to_string(ep);
    b.save_dir.clear();
    b.save_every = 0;
    b.resume = step6;
    const LoopRun r = run_loop(world(), b);
    SCOPED_TRACE("ep2 -> ep" + std::to_string(ep));
    ASSERT_EQ(r.first_step, 7);
    ASSERT_EQ(r.losses.size(), 6u);
    for (size_t k = 0; k < r.losses.size(); ++k) {
      EXPECT_NEAR(r.losses[k], ref.losses[6 + k], 1e-5 * std::abs(ref.losses[6 + k])) << "step " << 7 + k;
    }
  }
}

// AdamW hardly sees a gradient's scale: a doubled or missing factor (1/ep,
// a sum over TP of the split weights' full gradients) would change little
// above. Plain SGD moves each weight by lr x its gradient, so the losses of
// 20 SGD steps hold the expert-TP gradients to the one-process ones.
TEST(MoELayouts, ExpertTpUnderSgd) {
  ASSERT_EQ(world()->size(), 4);
  const std::string dir = job_dir("sgd");
  RunConfig base = moe_config(dir, 0.0);
  base.optimizer = "sgd";
  base.momentum = 0;
  base.lr = 0.5;
  base.min_lr = 0.5;
  const LoopRun ref = reference(base, dir);
  for (const Layout& l : {Layout{.tp = 2, .ep = 2, .expert_tp = true, .name = "tp2 ep2 expert-tp sgd"},
                          Layout{.tp = 4, .expert_tp = true, .name = "tp4 expert-tp sgd"}}) {
    RunConfig c = base;
    c.out = dir + "/" + l.name;
    c.layout.tp = l.tp;
    c.layout.ep = l.ep;
    c.layout.expert_tp = l.expert_tp;
    expect_same(ref, run_loop(world(), c), l.name);
  }
}

// Experts split over TP are saved as TP boxes of the global expert tensors:
// a checkpoint of tp2 x ep2 with --expert-tp resumes at ep4 (whole experts,
// no TP) and at tp2 x dp2 (every expert on every rank, split over TP) with
// the losses of the uninterrupted run.
TEST(MoECheckpoint, ExpertTpReshards) {
  ASSERT_EQ(world()->size(), 4);
  const std::string dir = job_dir("ckpt-etp");
  RunConfig a = moe_config(dir + "/a", 1.0);
  a.layout.tp = 2;
  a.layout.ep = 2;
  a.layout.expert_tp = true;
  a.steps = 12;
  a.save_every = 6;
  const LoopRun ref = run_loop(world(), a);
  ASSERT_EQ(ref.losses.size(), 12u);
  const std::string step6 = (fs::path(a.checkpoint_dir()) / "step-00000006").string();
  struct To {
    int tp, ep;
    bool expert_tp;
    std::string name;
  };
  for (const To& to : {To{1, 4, false, "ep4"}, To{2, 1, true, "tp2 dp2 expert-tp"}}) {
    RunConfig b = a;
    b.layout.tp = to.tp;
    b.layout.ep = to.ep;
    b.layout.expert_tp = to.expert_tp;
    b.out = dir + "/" + std::to_string(to.tp) + "-" + std::to_string(to.ep);
    b.save_dir.clear();
    b.save_every = 0;
    b.resume = step6;
    const LoopRun r = run_loop(world(), b);
    SCOPED_TRACE("tp2 ep2 expert-tp -> " + to.name);
    ASSERT_EQ(r.first_step, 7);
    ASSERT_EQ(r.losses.size(), 6u);
    for (size_t k = 0; k < r.losses.size(); ++k) {
      EXPECT_NEAR(r.losses[k], ref.losses[6 + k], 1e-5 * std::abs(ref.losses[6 + k])) << "step " << 7 + k;
    }
  }
}

}  // namespace
}  // namespace torus::train_test
