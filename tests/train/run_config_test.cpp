// The option table of a training run (run_config.h): command-line forms,
// config files and their precedence, errors, validation, the JSON record.
#include "torus/run/run_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "torus/core/error.h"

namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

RunConfig parse(std::vector<std::string> args) {
  RunConfig c;
  EXPECT_EQ(parse_run_config(args, c), ParseOutcome::kOk);
  return c;
}

std::string parse_error(std::vector<std::string> args) {
  RunConfig c;
  try {
    parse_run_config(args, c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string temp_file(const std::string& text) {
  char tmpl[] = "/tmp/torus_cfg_XXXXXX";
  const int fd = ::mkstemp(tmpl);
  EXPECT_GE(fd, 0);
  ::close(fd);
  std::ofstream(tmpl) << text;
  return tmpl;
}

TEST(RunConfig, DefaultsAndForms) {
  const RunConfig d;
  EXPECT_EQ(parse({}).layout.tp, d.layout.tp);
  const RunConfig c = parse({"--tp", "2", "--pp=4", "--lr", "3e-3", "--precision", "bf16", "--sp", "--no-tie-embeddings",
                             "--stage-layers", "3,1", "--recompute=every:2"});
  EXPECT_EQ(c.layout.tp, 2);
  EXPECT_EQ(c.layout.pp, 4);
  EXPECT_DOUBLE_EQ(c.lr, 3e-3);
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_TRUE(c.layout.sequence_parallel);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.layout.layers_per_stage, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(c.layout.recompute, "every:2");
  // A dash and an underscore are the same; bools take values.
  const RunConfig u = parse({"--min_lr", "0.5e-4", "--micro_batches=8", "--sp=false", "--tensorboard=off"});
  EXPECT_DOUBLE_EQ(u.min_lr, 0.5e-4);
  EXPECT_EQ(u.layout.num_micro, 8);
  EXPECT_FALSE(u.layout.sequence_parallel);
  EXPECT_FALSE(u.tensorboard);
  RunConfig h;
  EXPECT_EQ(parse_run_config(std::vector<std::string>{"--help"}, h), ParseOutcome::kHelp);
}

// A repeated option takes its last value (argparse's and torchrun's rule),
// for plain options, bools and the layout's fields alike.
TEST(RunConfig, RepeatedOptionTakesTheLast) {
  EXPECT_EQ(parse({"--hidden", "96", "--steps", "3", "--hidden", "100"}).hidden, 100);
  EXPECT_EQ(parse({"--tp", "2", "--tp=4"}).layout.tp, 4);
  EXPECT_FALSE(parse({"--sp", "--no-sp"}).layout.sequence_parallel);
  EXPECT_TRUE(parse({"--no-sp", "--sp"}).layout.sequence_parallel);
  EXPECT_EQ(parse({"--zero", "1", "--zero", "3"}).layout.zero, 3);
  EXPECT_EQ(parse_error({"--hidden", "96", "--hiden", "100"}), "unknown option '--hiden' (did you mean '--hidden'?)");
  // The micro-batches default: 1 without a pipeline, enough to fill one otherwise.
  EXPECT_EQ(parse({}).layout.resolved(2).num_micro, 1);
  EXPECT_EQ(parse({"--pp", "2"}).layout.resolved(2).num_micro, 4);
  EXPECT_EQ(parse({"--pp", "2", "--micro-batches", "2"}).layout.resolved(2).num_micro, 2);
}

// Note [One layout]: every field of the layout is an option of the run, by
// the same name, and its JSON record and values carry it — no field list here.
TEST(RunConfig, EveryLayoutFieldIsAnOption) {
  const std::vector<std::string> names = run_option_names();
  RunConfig c;
  c.layout.tp = 3;
  const auto j = nlohmann::json::parse(c.to_json());
  for (const parallel::LayoutField& f : parallel::layout_fields()) {
    EXPECT_NE(std::find(names.begin(), names.end(), f.name), names.end()) << f.name;
    EXPECT_TRUE(j.contains(f.name)) << f.name;
    // The option parses into the layout through the field's own setter.
    if (f.kind != parallel::LayoutField::Kind::kBool) {
      const std::string v = f.get(c.layout);
      if (!v.empty()) EXPECT_EQ(f.get(parse({"--" + f.name, v}).layout), v) << f.name;
    }
  }
  EXPECT_EQ(j["tp"], 3);
}

TEST(RunConfig, ConfigFileThenFlags) {
  const std::string path = temp_file(
      "# a run\nlayers = 6\nhidden = 64\nmin_lr = 2e-5   # underscores work here too\nschedule = \"zb-h1\"\n"
      "sp = true\nsteps = 999\n");
  // Flags override the file wherever they stand (Note [Option precedence]).
  const RunConfig c = parse({"--steps", "12", "--config", path, "--hidden", "96"});
  EXPECT_EQ(c.layers, 6);
  EXPECT_EQ(c.hidden, 96);
  EXPECT_DOUBLE_EQ(c.min_lr, 2e-5);
  EXPECT_EQ(c.layout.schedule, pp::ScheduleKind::kZeroBubbleH1);
  EXPECT_TRUE(c.layout.sequence_parallel);
  EXPECT_EQ(c.steps, 12);
  std::remove(path.c_str());

  const std::string bad = temp_file("layers = 6\nlayerz = 2\n");
  EXPECT_NE(parse_error({"--config", bad}).find("layerz"), std::string::npos);
  std::remove(bad.c_str());
  EXPECT_NE(parse_error({"--config", "/nonexistent/run.toml"}).find("/nonexistent/run.toml"), std::string::npos);
}

TEST(RunConfig, ErrorsNameTheOption) {
  EXPECT_NE(parse_error({"--tp", "x"}).find("--tp"), std::string::npos);
  EXPECT_EQ(parse_error({"--schedul", "1f1b"}), "unknown option '--schedul' (did you mean '--schedule'?)");
  EXPECT_EQ(parse_error({"--lrr=1"}), "unknown option '--lrr' (did you mean '--lr'?)");
  EXPECT_EQ(parse_error({"--zzzzzz"}), "unknown option '--zzzzzz'");
  EXPECT_NE(parse_error({"--lr"}).find("lr"), std::string::npos);
  EXPECT_NE(parse_error({"stray"}).find("stray"), std::string::npos);
  EXPECT_NE(parse_error({"--stage-layers", "3,x"}).find("--stage-layers"), std::string::npos);
  // A failed parse leaves the destination as it was.
  RunConfig c;
  c.layout.tp = 7;
  EXPECT_THROW(parse_run_config(std::vector<std::string>{"--pp", "2", "--tp", "x"}, c), InvalidArgument);
  EXPECT_EQ(c.layout.tp, 7);
  EXPECT_EQ(c.layout.pp, 1);
}

TEST(RunConfig, Validate) {
  auto invalid = [](auto edit, const std::string& word) {
    RunConfig c;
    edit(c);
    try {
      c.validate();
      ADD_FAILURE() << "no error for " << word;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  RunConfig().validate();
  invalid([](RunConfig& c) { c.precision = "f8"; }, "--precision");
  invalid([](RunConfig& c) { c.optimizer = "lamb"; }, "--optimizer");
  invalid([](RunConfig& c) { c.layout.recompute = "some"; }, "--recompute");
  invalid([](RunConfig& c) { c.warmup = 700; }, "--warmup");
  invalid([](RunConfig& c) { c.min_lr = 1; }, "--min-lr");
  invalid([](RunConfig& c) { c.dropout = 1; }, "--dropout");
  invalid([](RunConfig& c) {
    c.autocast = true;
    c.precision = "bf16";
  }, "--autocast");
  RunConfig w;
  EXPECT_EQ(w.warmup_steps(), 30);
  w.steps = 50;
  EXPECT_EQ(w.warmup_steps(), 5);
  w.warmup = 7;
  EXPECT_EQ(w.warmup_steps(), 7);
}

// ZeRO, offload and the memory pre-check's --force.
TEST(RunConfig, ZeroOffloadForce) {
  const RunConfig d;
  EXPECT_EQ(d.layout.zero, 0);
  EXPECT_EQ(dp::offload_name(d.layout.offload), "none");
  EXPECT_EQ(d.zero_prefetch, 1);
  EXPECT_FALSE(d.force);
  const RunConfig c = parse({"--zero", "3", "--offload=optimizer+params", "--zero_prefetch", "2", "--force"});
  EXPECT_EQ(c.layout.zero, 3);
  EXPECT_EQ(dp::offload_name(c.layout.offload), "optimizer+params");
  EXPECT_EQ(c.zero_prefetch, 2);
  EXPECT_TRUE(c.force);
  c.validate();
  parse({"--zero", "1", "--offload", "optimizer"}).validate();
  parse({"--zero", "2", "--offload", "optimizer"}).validate();
  EXPECT_NE(parse_error({"--zero", "two"}).find("--zero"), std::string::npos);

  const std::string path = temp_file("zero = 2\noffload = \"optimizer\"\nforce = true\n");
  const RunConfig f = parse({"--config", path});
  EXPECT_EQ(f.layout.zero, 2);
  EXPECT_EQ(dp::offload_name(f.layout.offload), "optimizer");
  EXPECT_TRUE(f.force);
  std::remove(path.c_str());

  auto message = [](std::vector<std::string> args) {
    RunConfig r = parse(std::move(args));
    try {
      r.validate();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error";
    return std::string();
  };
  EXPECT_EQ(message({"--zero", "4"}), "--zero must be 0, 1, 2 or 3, got 4");
  EXPECT_EQ(message({"--zero=-1"}), "--zero must be 0, 1, 2 or 3, got -1");
  EXPECT_EQ(message({"--offload", "optimizer"}),
            "--offload optimizer needs ZeRO: use it with --zero 1, 2 or 3 (got --zero 0)");
  EXPECT_EQ(message({"--zero", "2", "--offload", "optimizer+params"}),
            "--offload optimizer+params offloads parameter shards: it needs --zero 3 (got --zero 2)");
  // The offload's form is checked as it is parsed (one enumeration, parallel/data/offload.h).
  EXPECT_EQ(parse_error({"--zero", "1", "--offload", "gpu"}),
            "--offload must be one of none, optimizer, optimizer+params, got 'gpu'");
  EXPECT_EQ(message({"--zero", "3", "--zero-prefetch=-1"}), "--zero-prefetch must be >= 0, got -1");
}

TEST(RunConfig, ValuesJsonAndHelp) {
  const RunConfig c = parse({"--tp", "2", "--lr", "0.1", "--sp"});
  const auto values = c.values();
  const auto names = run_option_names();
  ASSERT_EQ(values.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(values[i].first, names[i]);
  const auto j = nlohmann::json::parse(c.to_json());
  EXPECT_EQ(j["tp"], 2);
  EXPECT_DOUBLE_EQ(j["lr"].get<double>(), 0.1);
  EXPECT_EQ(j["sp"], true);
  EXPECT_EQ(j["precision"], "f32");
  EXPECT_EQ(j.size(), names.size());
  const std::string help = run_config_help("torus-train", "Trains.");
  for (const auto& n : names) {
    EXPECT_TRUE(help.find("--" + n + " ") != std::string::npos || help.find("--[no-]" + n) != std::string::npos) << n;
  }
  EXPECT_NE(help.find("--[no-]sp"), std::string::npos) << help;
  EXPECT_NE(help.find("--config"), std::string::npos);
  EXPECT_NE(help.find("--help"), std::string::npos);
}

}  // namespace
}  // namespace torus::train_test
