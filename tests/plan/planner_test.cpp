// The planner (plan/planner.h): the ZeRO paper's memory table, the
// Megatron-LM SC21 configurations, the ranking and the request checks.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "torus/core/error.h"
#include "torus/plan/hardware.h"
#include "torus/plan/planner.h"
#include "torus/run/run_config.h"

namespace {

using namespace torus;

// The value rounded to `decimals` places, as printed.
double printed(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

TEST(ZeroTable, ReproducesThePaperToItsPrintedPrecision) {
  // Rajbhandari et al. 2020 (ZeRO), Table 1: 7.5B parameters, K = 12, GB.
  struct Paper {
    int64_t nd;
    const char* cells[4];  // baseline, P_os, P_os+g, P_os+g+p as printed
  };
  const std::vector<Paper> paper = {
      {1, {"120", "120", "120", "120"}},      {4, {"120", "52.5", "41.25", "30"}},
      {16, {"120", "35.6", "21.6", "7.5"}},   {64, {"120", "31.4", "16.6", "1.88"}},
      {256, {"120", "30.4", "15.4", "0.47"}}, {1024, {"120", "30.1", "15.1", "0.12"}},
  };
  std::vector<int64_t> nd;
  for (const Paper& p : paper) nd.push_back(p.nd);
  const std::vector<plan::ZeroRow> rows = plan::zero_memory_table(7'500'000'000, nd);
  ASSERT_EQ(rows.size(), paper.size());
  for (size_t i = 0; i < paper.size(); ++i) {
    EXPECT_EQ(rows[i].nd, paper[i].nd);
    for (int s = 0; s < 4; ++s) {
      const std::string cell = paper[i].cells[s];
      const size_t dot = cell.find('.');
      const int decimals = dot == std::string::npos ? 0 : static_cast<int>(cell.size() - dot - 1);
      EXPECT_DOUBLE_EQ(printed(rows[i].stage[s] / 1e9, decimals), std::stod(cell))
          << "Nd " << paper[i].nd << " stage " << s << ": " << rows[i].stage[s] / 1e9 << " GB";
    }
  }
}

TEST(ZeroTable, StagesFollowTheFormulas) {
  // Independent closed forms: (2 + 2 + K) Ψ, 4Ψ + KΨ/N, 2Ψ + (2 + K)Ψ/N, 16Ψ/N.
  const int64_t psi = 1'000'000;
  const auto rows = plan::zero_memory_table(psi, {8});
  const double p = static_cast<double>(psi);
  EXPECT_DOUBLE_EQ(rows[0].stage[0], 16 * p);
  EXPECT_DOUBLE_EQ(rows[0].stage[1], 4 * p + 12 * p / 8);
  EXPECT_DOUBLE_EQ(rows[0].stage[2], 2 * p + 14 * p / 8);
  EXPECT_DOUBLE_EQ(rows[0].stage[3], 16 * p / 8);
  EXPECT_THROW(plan::zero_memory_table(0, {1}), InvalidArgument);
  EXPECT_THROW(plan::zero_memory_table(10, {0}), InvalidArgument);
}

plan::PlanRequest gpt_request(int64_t layers, int64_t hidden, int64_t heads, int64_t vocab, int64_t seq, int64_t batch,
                              const std::string& hardware, int nodes) {
  plan::PlanRequest r;
  r.run.model = "gpt";
  r.run.layers = layers;
  r.run.hidden = hidden;
  r.run.heads = heads;
  r.run.vocab = vocab;
  r.run.seq = seq;
  r.run.batch = batch;
  r.run.precision = "fp16";
  r.run.optimizer = "adam";
  r.run.tie_embeddings = true;
  r.hardware = *plan::find_hardware(hardware);
  r.nodes = nodes;
  return r;
}

// Megatron-LM's count of a step's FLOPs (Narayanan et al. 2021, eq. 3; with
// full recompute): 96 B s l h^2 (1 + s / 6h + V / 16 l h).
double megatron_flops(double B, double s, double l, double h, double V) {
  return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
}

TEST(Megatron, Sc21ConfigurationsFitAndTheirThroughputIsPredicted) {
  // Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training
  // on GPU Clusters Using Megatron-LM"), Table 1: A100 80 GB DGX nodes,
  // sequence 2048, vocabulary 51200, full recompute.
  struct Row {
    const char* name;
    int64_t heads, hidden, layers;
    int tp, pp, gpus;
    int64_t batch;
    double tflops;  // achieved per GPU
  };
  const std::vector<Row> table = {
      {"1.7B", 24, 2304, 24, 1, 1, 32, 512, 137},      {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 138},
      {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 142},     {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135},
      {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138},   {"76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140},
      {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148}, {"310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155},
      {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163}, {"1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163},
  };
  std::printf("%-8s %-22s %-22s %10s %10s %7s %10s\n", "model", "published tp/pp/dp", "planner tp/pp/dp", "pub TF/s",
              "pred TF/s", "ratio", "planner TF/s");
  for (const Row& row : table) {
    plan::PlanRequest req =
        gpt_request(row.layers, row.hidden, row.heads, 51200, 2048, row.batch, "dgx-a100", row.gpus / 8);
    req.recompute = {"full"};  // as published
    req.schedules = {"1f1b", "interleaved"};
    req.zero_stages = {0, 1};  // the published runs shard nothing; ZeRO-1 is the distributed optimizer
    req.micro_batch_rows = {1, 2, 4, 8};
    req.allow_offload = false;
    const int dp = row.gpus / (row.tp * row.pp);
    // The published layout, at its best micro-batch size and schedule.
    plan::Candidate published;
    bool found = false;
    for (const char* sched : {"1f1b", "interleaved"}) {
      for (int64_t b : {1, 2, 4, 8}) {
        if (row.batch % (dp * b) != 0) continue;
        plan::PlanRequest one = req;
        one.run.layout.tp = row.tp;
        one.run.layout.pp = row.pp;
        one.run.layout.dp = dp;
        one.run.layout.sequence_parallel = row.tp > 1;
        one.run.layout.schedule = pp::schedule_kind_from_name(row.pp > 1 ? sched : "1f1b");
        one.run.layout.num_chunks = row.pp > 1 && std::string(sched) == "interleaved" ? 2 : 1;
        one.run.layout.recompute = "full";
        one.run.layout.num_micro = static_cast<int>(row.batch / (dp * b));
        try {
          const plan::Candidate c = plan::evaluate_layout(one);
          if (c.fits && (!found || c.step_s < published.step_s)) {
            published = c;
            found = true;
          }
        } catch (const InvalidArgument&) {
        }
      }
    }
    ASSERT_TRUE(found) << row.name << ": the published layout does not fit in 80 GB per the planner";
    const double pub_pred = megatron_flops(row.batch, 2048, row.layers, row.hidden, 51200) / published.step_s /
                            row.gpus / 1e12;
    const plan::Plan p = plan::make_plan(req);
    ASSERT_NE(p.best(), nullptr) << row.name;
    const plan::Candidate& best = *p.best();
    const double best_pred = megatron_flops(row.batch, 2048, row.layers, row.hidden, 51200) / best.step_s /
                             row.gpus / 1e12;
    std::printf("%-8s %-22s %-22s %10.0f %10.1f %7.2f %10.1f\n", row.name,
                fmt::format("{}/{}/{}", row.tp, row.pp, dp).c_str(),
                fmt::format("{}/{}/{}", best.config.layout.tp, best.config.layout.pp, best.config.layout.dp).c_str(), row.tflops, pub_pred,
                pub_pred / row.tflops, best_pred);
    // The planner's choice is at least as fast as the published layout by
    // its own model, and that model's throughput for the published layout
    // is within a factor of 1.5 of the measured one.
    EXPECT_LE(best.step_s, published.step_s * (1 + 1e-9)) << row.name;
    EXPECT_GT(pub_pred / row.tflops, 1 / 1.5) << row.name;
    EXPECT_LT(pub_pred / row.tflops, 1.5) << row.name;
    // The model's FLOPs per step are Megatron's without the recompute term.
    const double model_flops = p.flops_per_token * row.batch * 2048;
    const double mega72 = megatron_flops(row.batch, 2048, row.layers, row.hidden, 51200) * 0.75;
    EXPECT_NEAR(model_flops / mega72, 1.0, 0.02) << row.name;
  }
}

TEST(Planner, RanksFittingLayoutsByStepTime) {
  plan::PlanRequest req = gpt_request(24, 2048, 16, 50304, 2048, 256, "h100-80gb", 2);
  req.run.precision = "bf16";
  const plan::Plan p = plan::make_plan(req);
  ASSERT_NE(p.best(), nullptr);
  EXPECT_EQ(p.devices, 16);
  EXPECT_GT(p.evaluated, 100);
  bool seen_unfit = false;
  for (size_t i = 0; i < p.candidates.size(); ++i) {
    const plan::Candidate& c = p.candidates[i];
    EXPECT_EQ(int64_t{c.config.layout.tp} * c.config.layout.pp * c.config.layout.dp * c.config.layout.ep, 16) << c.layout();
    EXPECT_LE(c.config.layout.tp, 8) << "TP stays inside a node";
    EXPECT_EQ(c.micro_batch_rows * c.config.layout.num_micro * c.config.layout.dp * c.config.layout.ep, 256) << c.layout();
    if (!c.fits) seen_unfit = true;
    EXPECT_FALSE(c.fits && seen_unfit) << "a fitting layout after one that does not fit";
    if (i > 0 && c.fits) EXPECT_GE(c.step_s, p.candidates[i - 1].step_s) << c.layout();
    EXPECT_GT(c.step_s, 0);
    EXPECT_LE(c.mfu, req.hardware.efficiency + 1e-12) << "MFU above the assumed efficiency: " << c.layout();
    if (c.fits) EXPECT_LE(c.memory.device(), 0.9 * req.hardware.device_memory);
  }
  const std::string table = plan::plan_table(p, 5);
  EXPECT_NE(table.find("best: " + p.best()->layout()), std::string::npos) << table;
  const nlohmann::json j = nlohmann::json::parse(plan::plan_json(p, 3));
  EXPECT_EQ(j["candidates"].size(), 3u);
  EXPECT_EQ(j["best"]["layout"], p.best()->layout());
  EXPECT_DOUBLE_EQ(j["best"]["seconds"]["step"].get<double>(), p.best()->step_s);
}

TEST(Planner, ShardsAModelThatDoesNotFitReplicated) {
  // 13B in fp16 with Adam: 18 bytes a parameter replicated (234 GB) cannot
  // fit one 40 GB device without sharding.
  plan::PlanRequest req = gpt_request(40, 5120, 40, 50304, 2048, 64, "a100-40gb", 1);
  const plan::Plan p = plan::make_plan(req);
  ASSERT_NE(p.best(), nullptr);
  const plan::Candidate& b = *p.best();
  EXPECT_TRUE(b.config.layout.tp > 1 || b.config.layout.pp > 1 || b.config.layout.zero >= 1 || b.config.layout.offload != dp::Offload::kNone) << b.layout();
  for (const plan::Candidate& c : p.candidates) {
    if (c.config.layout.tp == 1 && c.config.layout.pp == 1 && c.config.layout.zero == 0) {
      EXPECT_FALSE(c.fits) << c.layout();
    }
  }
}

TEST(Planner, NothingFitsIsReportedNotHidden) {
  plan::PlanRequest req = gpt_request(96, 12288, 96, 51200, 2048, 8, "a100-40gb", 1);  // 175B on 8 x 40 GB
  req.allow_offload = false;
  const plan::Plan p = plan::make_plan(req);
  EXPECT_EQ(p.best(), nullptr);
  ASSERT_FALSE(p.candidates.empty());
  EXPECT_FALSE(p.candidates.front().fits);
  EXPECT_FALSE(p.candidates.front().why_not.empty());
  EXPECT_NE(plan::plan_table(p).find("no layout fits"), std::string::npos);
}

TEST(Planner, MixtureOfExpertsConsidersExpertParallelism) {
  plan::PlanRequest req = gpt_request(8, 1024, 16, 32000, 1024, 64, "h100-80gb", 1);
  req.run.moe_every = 2;
  req.run.experts = 8;
  req.run.top_k = 2;
  const plan::Plan p = plan::make_plan(req);
  bool any_ep = false;
  for (const plan::Candidate& c : p.candidates) {
    if (c.config.layout.ep > 1) {
      any_ep = true;
      EXPECT_GT(c.ep_bytes, 0) << c.layout();
      EXPECT_EQ(8 % c.config.layout.ep, 0);
    }
  }
  EXPECT_TRUE(any_ep);
}

TEST(Planner, BadRequestsAreRefused) {
  plan::PlanRequest req = gpt_request(4, 256, 4, 256, 128, 8, "h100-80gb", 1);
  req.nodes = 0;
  EXPECT_THROW(plan::make_plan(req), InvalidArgument);
  req.nodes = 1;
  req.run.batch = 7;  // only 1 row x 7 micro-batches on one data rank divides it
  EXPECT_NO_THROW(plan::make_plan(req));
  req.run.model = "no-such-model";
  EXPECT_THROW(plan::make_plan(req), InvalidArgument);
  req.run.model = "gpt";
  req.efficiency = 2;
  EXPECT_THROW(plan::make_plan(req), InvalidArgument);
  req.efficiency = 0;
  req.hardware.devices_per_node = 0;
  EXPECT_THROW(plan::make_plan(req), InvalidArgument);
  EXPECT_NE(plan::find_hardware("trn1"), nullptr);
  EXPECT_EQ(plan::find_hardware("tpu"), nullptr);
}

TEST(Planner, RunConfigKnowsThePlanOptions) {
  run::RunConfig c;
  run::parse_run_config(std::vector<std::string>{"--plan", "--plan-hardware", "a100-80gb"}, c);
  EXPECT_TRUE(c.plan);
  EXPECT_EQ(c.plan_hardware, "a100-80gb");
  EXPECT_NO_THROW(c.validate());
  c.plan_hardware = "tpu-v9";
  EXPECT_THROW(c.validate(), InvalidArgument);
}

}  // namespace
