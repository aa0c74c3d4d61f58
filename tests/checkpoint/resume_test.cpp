// Checkpoints of whole training runs (engine/checkpointing.h) through the
// training loop, under mpirun. The reference is always the uninterrupted
// run in the same job: it saves every few steps, and the resumed runs start
// from one of its checkpoints (or a checkpoint of a resumed run).
//  np1: keep-last never deletes the only good checkpoint, also when a save
//       fails (injected ENOSPC); --resume auto skips a corrupt newest one;
//       --init-from a plain safetensors file.
//  np4: the same layout (pp2 x dp2) resumes with bit-identical losses —
//       1F1B and ZB-H1 with dropout, ZeRO-1, fp16 with dynamic loss
//       scaling, bf16 with fp32 masters under ZeRO-2, an asynchronous
//       save — and the metrics log is appended, not truncated.
//  np8: resharding: tp2 x pp2 x dp2 ZeRO-2 -> tp1 x pp1 x dp4 ZeRO-3 (4
//       ranks) -> one process -> back to tp2 x pp2 x dp2 ZeRO-2, each
//       continuing with the losses of the uninterrupted run within 1e-5.
#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/file_io.h"
#include "parallel/parallel_test_util.h"
#include "support/job_dir.h"
#include "torus/checkpoint/checkpoint.h"
#include "torus/engine/checkpointing.h"
#include "torus/run/train_loop.h"

namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

namespace fs = std::filesystem;
using testing::world;

std::string job_dir(const std::string& name) { return testing::job_dir("torus_ckpt_job", name); }

RunConfig tiny(const std::string& out) {
  RunConfig c;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 2;
  c.seq = 16;
  c.batch = 8;
  c.layout.num_micro = 2;
  c.steps = 6;
  c.warmup = 2;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.eval_interval = 0;
  c.eval_batches = 1;
  c.tensorboard = false;
  c.progress = "off";
  c.peak_tflops = 1;
  c.threads = 1;
  c.out = out;
  return c;
}

struct LoopRun {
  std::vector<double> losses;  // of the steps this run took
  int64_t first_step = 0;      // 1-based step of losses[0]
};

LoopRun run_loop(const comm::ProcessGroupPtr& group, const RunConfig& c) {
  TrainLoop loop(group, c, "test");
  loop.set_line_sink([](std::string_view) {});
  LoopRun r;
  loop.on_step([&](const StepRecord& rec) {
    if (r.losses.empty()) r.first_step = rec.step;
    r.losses.push_back(rec.loss);
  });
  loop.run();
  return r;
}

std::string step_path(const RunConfig& c, int64_t step) {
  return (fs::path(c.checkpoint_dir()) / fmt::format("step-{:08d}", step)).string();
}

// resumed.losses continue ref.losses from resumed.first_step.
void expect_continues(const LoopRun& ref, const LoopRun& resumed, double rtol, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_GE(resumed.first_step, 1);
  ASSERT_EQ(resumed.first_step - 1 + static_cast<int64_t>(resumed.losses.size()),
            static_cast<int64_t>(ref.losses.size()));
  for (size_t k = 0; k < resumed.losses.size(); ++k) {
    const double want = ref.losses[resumed.first_step - 1 + k];
    if (rtol == 0) {
      EXPECT_EQ(resumed.losses[k], want) << "step " << resumed.first_step + k;
    } else {
      EXPECT_NEAR(resumed.losses[k], want, rtol * std::abs(want)) << "step " << resumed.first_step + k;
    }
  }
}

// --- np1 -----------------------------------------------------------------------

TEST(Policy, KeepLastNeverDeletesTheOnlyGoodCheckpoint) {
  ASSERT_EQ(world()->size(), 1) << "an np1 case (tests.cmake runs each on its world size)";
  const std::string dir = job_dir("keep_last");
  RunConfig c = tiny(dir);
  c.save_every = 1;
  c.keep_last = 1;
  // What a killed earlier run can leave: a step directory without COMPLETE
  // and an unfinished save. The run removes both before it saves.
  fs::create_directories(c.checkpoint_dir() + "/step-00000009");
  fs::create_directories(c.checkpoint_dir() + "/step-00000009.tmp-0123456789ab");
  // The third save finds the disk full.
  TrainLoop loop(world(), c, "test");
  loop.set_line_sink([](std::string_view) {});
  loop.on_step_begin([](int64_t step) {
    if (step == 2) ckpt::inject_write_failure(0);
  });
  std::string error;
  try {
    loop.run();
  } catch (const ckpt::CheckpointError& e) {
    error = e.what();
  }
  ckpt::inject_write_failure(-1);
  EXPECT_NE(error.find("errno 28"), std::string::npos) << error;
  EXPECT_NE(error.find(".safetensors"), std::string::npos) << error;
  std::vector<int64_t> complete;
  for (const auto& l : ckpt::list_checkpoints(c.checkpoint_dir())) {
    if (l.complete) complete.push_back(l.step);
  }
  EXPECT_EQ(complete, std::vector<int64_t>{2}) << "keep-last 1 must keep step 2 when step 3 fails";
  EXPECT_FALSE(fs::exists(c.checkpoint_dir() + "/step-00000009"));
  EXPECT_FALSE(fs::exists(c.checkpoint_dir() + "/step-00000009.tmp-0123456789ab"));
  const auto ck = ckpt::Checkpoint::open(step_path(c, 2));
  ck.verify();

  // The failed run resumes from it.
  RunConfig again = c;
  again.resume = "auto";
  const LoopRun r = run_loop(world(), again);
  EXPECT_EQ(r.first_step, 3);
  EXPECT_EQ(r.losses.size(), 4u);
}

TEST(Resume, AutoSkipsACorruptNewestCheckpoint) {
  ASSERT_EQ(world()->size(), 1) << "an np1 case (tests.cmake runs each on its world size)";
  const std::string dir = job_dir("auto_skip");
  RunConfig c = tiny(dir);
  c.save_every = 2;
  const LoopRun ref = run_loop(world(), c);
  ASSERT_EQ(ref.losses.size(), 6u);
  // Step 6 corrupt, step 4 good: auto resumes at 5 — and repeats ref's steps.
  {
    std::fstream f(step_path(c, 6) + "/rank-00000.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  RunConfig again = c;
  again.resume = "auto";
  again.save_every = 0;
  again.out = dir + "/again";
  again.save_dir = c.checkpoint_dir();
  const LoopRun r = run_loop(world(), again);
  expect_continues(ref, r, 0, "auto after a corrupt step 6");
  EXPECT_EQ(r.first_step, 5);

  // An explicit path to the corrupt one is an error naming the file.
  RunConfig bad = again;
  bad.resume = step_path(c, 6);
  try {
    run_loop(world(), bad);
    FAIL() << "a corrupt checkpoint was accepted";
  } catch (const ckpt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("rank-00000.safetensors"), std::string::npos) << e.what();
  }
  // Another model is refused, naming the option.
  RunConfig other = again;
  other.hidden = 64;
  try {
    run_loop(world(), other);
    FAIL() << "another model was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("hidden"), std::string::npos) << e.what();
  }
  // Other data is refused, naming both sources.
  RunConfig other_data = again;
  other_data.data = dir + "/other.txt";
  {
    std::ofstream text(other_data.data);
    for (int i = 0; i < 4000; ++i) text << "other data, line " << i << "\n";
  }
  try {
    run_loop(world(), other_data);
    FAIL() << "other data was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("other.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("other data"), std::string::npos) << e.what();
  }
}

TEST(Resume, InitFromAPlainSafetensorsFile) {
  ASSERT_EQ(world()->size(), 1) << "an np1 case (tests.cmake runs each on its world size)";
  const std::string dir = job_dir("init_from");
  RunConfig c = tiny(dir);
  c.steps = 3;
  c.save_final = true;
  run_loop(world(), c);
  const auto ck = ckpt::Checkpoint::open(step_path(c, 3));
  const std::string file = dir + "/model.safetensors";
  ckpt::export_safetensors(ck, file);
  const auto exported = ckpt::read_safetensors(file);
  RunConfig init = tiny(dir + "/init");
  init.init_from = file;
  init.steps = 1;
  init.warmup = 0;
  TrainLoop loop(world(), init, "test");
  const auto params = loop.trainer().gather_local_parameters();
  ASSERT_FALSE(params.empty());
  for (const auto& [name, t] : params) {
    auto it = exported.find(name);
    ASSERT_NE(it, exported.end()) << name;
    EXPECT_TRUE(at::equal(t, it->second)) << name;
  }
}

// --- np4 -----------------------------------------------------------------------

void same_layout_case(const std::string& name, RunConfig c) {
  const std::string dir = job_dir(name);
  c.out = dir + "/ref";
  c.save_every = 3;
  const LoopRun ref = run_loop(world(), c);
  RunConfig again = c;
  again.out = dir + "/ref";  // the same output directory: metrics are appended
  again.resume = step_path(c, 3);
  again.save_every = 0;
  const LoopRun r = run_loop(world(), again);
  expect_continues(ref, r, 0, name);
  if (world()->rank() == world()->size() - 1) {
    // The logging rank wrote one metrics file: 6 steps, then 3 again after a resume record.
    std::ifstream in(c.out + "/metrics.jsonl");
    int steps = 0, resumes = 0;
    for (std::string line; std::getline(in, line);) {
      steps += line.find("\"event\":\"step\"") != std::string::npos;
      resumes += line.find("\"event\":\"resume\"") != std::string::npos;
    }
    EXPECT_EQ(steps, 9);
    EXPECT_EQ(resumes, 1);
  }
}

TEST(Resume, SameLayoutIsBitIdentical) {
  ASSERT_EQ(world()->size(), 4) << "an np4 case (tests.cmake runs each on its world size)";
  RunConfig c = tiny("");
  c.layout.pp = 2;
  c.dropout = 0.1;
  same_layout_case("1f1b_dropout", c);
  c.layout.schedule = pp::ScheduleKind::kZeroBubbleH1;
  c.layout.zero = 1;
  same_layout_case("zbh1_dropout_zero1", c);
  RunConfig h = tiny("");
  h.layout.pp = 2;
  h.precision = "fp16";
  h.initial_loss_scale = 16777216;  // the largest: it may overflow first; the scaler's state matters
  h.loss_scale_window = 2;
  same_layout_case("fp16_scaling", h);
  RunConfig b = tiny("");
  b.layout.pp = 2;
  b.precision = "bf16";  // fp32 master weights under ZeRO-2
  b.layout.zero = 2;
  same_layout_case("bf16_zero2", b);
  RunConfig a = tiny("");
  a.layout.pp = 2;
  a.async_save = true;
  a.keep_last = 2;  // steps 3 and 6 stay
  same_layout_case("async", a);
}

// --- np8 -----------------------------------------------------------------------

TEST(Reshard, AcrossLayoutsAndZeroStages) {
  ASSERT_EQ(world()->size(), 8) << "an np8 case (tests.cmake runs each on its world size)";
  const std::string dir = job_dir("reshard");
  RunConfig a = tiny(dir + "/a");
  a.layout.tp = 2;
  a.layout.pp = 2;
  a.layout.zero = 2;
  a.save_every = 2;
  const LoopRun ref = run_loop(world(), a);
  ASSERT_EQ(ref.losses.size(), 6u);

  // tp1 x pp1 x dp4, ZeRO-3, on ranks 0-3, from a's step 2; it saves at 3 and 4.
  auto four = world()->split(world()->rank() < 4 ? 0 : -1, world()->rank(), "four");
  RunConfig b = tiny(dir + "/b");
  b.layout.zero = 3;
  b.resume = step_path(a, 2);
  b.save_every = 1;
  b.steps = 6;
  if (four) {
    const LoopRun r = run_loop(four, b);
    expect_continues(ref, r, 1e-5, "tp2 pp2 dp2 zero2 -> dp4 zero3");
  }
  world()->barrier()->wait();

  // One process, from b's step 3; it saves at 4 and 5.
  auto one = world()->split(world()->rank() == 0 ? 0 : -1, 0, "one");
  RunConfig s = tiny(dir + "/s");
  s.resume = step_path(b, 3);
  s.save_every = 1;
  if (one) {
    const LoopRun r = run_loop(one, s);
    expect_continues(ref, r, 1e-5, "dp4 zero3 -> one process");
  }
  world()->barrier()->wait();

  // Back to tp2 x pp2 x dp2 ZeRO-2 from the single process's step 4.
  RunConfig back = a;
  back.out = dir + "/back";
  back.save_dir.clear();
  back.resume = step_path(s, 4);
  back.save_every = 0;
  const LoopRun r = run_loop(world(), back);
  expect_continues(ref, r, 1e-5, "one process -> tp2 pp2 dp2 zero2");
}

}  // namespace
}  // namespace torus::train_test
