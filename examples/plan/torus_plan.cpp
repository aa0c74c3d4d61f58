// torus-plan — chooses a parallel layout before a run: every tp x pp x dp
// (x ep) split of the cluster with each ZeRO stage, offload, recompute
// policy, schedule and micro-batch size, kept when it fits in memory and
// ranked by predicted step time (torus/plan/planner.h, docs/plan.md).
//
//   torus-plan --hardware h100-80gb --nodes 16 --global-batch 1024 --model llama-1b --seq 4096 --precision bf16
//   torus-plan --hardware cpu --ranks-per-node 2 --model gpt2-tiny --batch 8   # this host, measured
//   torus-plan --zero-table 7.5e9                                               # the ZeRO paper's Table 1
//   torus-plan --evaluate --hardware a100-80gb --nodes 2 --tp 8 --pp 2 ...      # one given layout
//
// Options other than the planner's own are torus-train's (the model, its
// shape, --seq, --batch, --precision, --optimizer, ...: torus-train --help),
// read by the same option table.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "torus/core/error.h"
#include "torus/plan/hardware.h"
#include "torus/plan/planner.h"
#include "torus/run/model_presets.h"
#include "torus/run/run_config.h"

namespace {

using namespace torus;

template <typename T>
std::vector<T> parse_list(const std::string& text, const char* what) {
  std::vector<T> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if constexpr (std::is_same_v<T, std::string>) {
      out.push_back(item);
    } else {
      try {
        size_t used = 0;
        const long long v = std::stoll(item, &used);
        if (used != item.size()) throw std::invalid_argument(item);
        out.push_back(static_cast<T>(v));
      } catch (const std::exception&) {
        throw InvalidArgument(fmt::format("{}: '{}' is not an integer", what, item));
      }
    }
  }
  return out;
}

int run_main(int argc, char** argv) {
  CLI::App app{
      "torus-plan: ranks parallel layouts (tp, pp, dp, ep, ZeRO stage, offload, recompute, schedule, micro-batches)\n"
      "of a model on a cluster by predicted step time, among those that fit in memory, and explains each\n"
      "(docs/plan.md). Every torus-train option is accepted too and describes the run: the model and its shape\n"
      "(--model, --layers, --hidden, --heads, --kv-heads, --ffn, --vocab, --seq, --moe-every, --experts, ...),\n"
      "--precision, --grad-dtype, --optimizer (see torus-train --help).",
      "torus-plan"};
  app.allow_extras();
  std::string hardware = "h100-80gb";
  int nodes = 1;
  int64_t global_batch = 0;
  bool json = false;
  int top = 10;
  double efficiency = 0;
  double memory_fraction = 0.9;
  int ranks_per_node = 0;
  std::string search_zero, search_recompute, search_schedules, search_rows;
  bool no_offload = false;
  bool evaluate_only = false;
  bool list = false;
  double zero_table = 0;
  app.add_option("--hardware", hardware, "hardware preset: " + plan::hardware_names())->capture_default_str();
  app.add_option("--nodes", nodes, "nodes")->capture_default_str();
  app.add_option("--global-batch", global_batch, "global batch in sequences (the same as --batch)");
  app.add_flag("--json", json, "print the plan as JSON instead of a table");
  app.add_option("--top", top, "layouts to show")->capture_default_str();
  app.add_option("--efficiency", efficiency, "share of the peak the matmuls reach (0: the hardware's)");
  app.add_option("--memory-fraction", memory_fraction, "share of a device's memory a layout may use")
      ->capture_default_str();
  app.add_option("--ranks-per-node", ranks_per_node, "--hardware cpu: ranks on this host (default: 2)");
  app.add_option("--search-zero", search_zero, "ZeRO stages to consider, e.g. 1,3 (default 0,1,2,3)");
  app.add_option("--search-recompute", search_recompute, "recompute policies to consider (default none,selective,full)");
  app.add_option("--search-schedules", search_schedules, "pipeline schedules to consider (default 1f1b,interleaved,zb-h1)");
  app.add_option("--search-rows", search_rows, "micro-batch sizes in rows to consider (default 1,2,4,8)");
  app.add_flag("--no-offload", no_offload, "do not consider offloading optimizer state to host memory");
  app.add_flag("--evaluate", evaluate_only,
               "evaluate the layout given by the torus-train options (--tp, --pp, --dp, --zero, ...) instead of searching");
  app.add_flag("--list", list, "list the hardware presets and model presets");
  app.add_option("--zero-table", zero_table,
                 "print the ZeRO paper's memory table (model states per device, K = 12) for this many parameters");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    throw InvalidArgument(e.what());
  }

  if (list) {
    std::cout << "hardware presets:\n";
    for (const plan::Hardware& h : plan::hardware_presets()) {
      std::cout << fmt::format("  {:<10} {}\n", h.name, h.description);
    }
    std::cout << "model presets:\n";
    for (const run::ModelPreset& m : run::model_presets()) {
      std::cout << fmt::format("  {:<12} {}\n", m.name, m.description);
    }
    return 0;
  }
  if (zero_table > 0) {
    const std::vector<int64_t> nd = {1, 4, 16, 64, 256, 1024};
    const auto rows = plan::zero_memory_table(static_cast<int64_t>(zero_table), nd);
    std::cout << fmt::format("model states per device (GB = 1e9 bytes), {:.3g} parameters, K = 12\n", zero_table);
    std::cout << fmt::format("{:>6} {:>10} {:>10} {:>10} {:>10}\n", "Nd", "baseline", "P_os", "P_os+g", "P_os+g+p");
    for (const auto& r : rows) {
      std::cout << fmt::format("{:>6} {:>10.4g} {:>10.4g} {:>10.4g} {:>10.4g}\n", r.nd, r.stage[0] / 1e9,
                               r.stage[1] / 1e9, r.stage[2] / 1e9, r.stage[3] / 1e9);
    }
    return 0;
  }

  plan::PlanRequest req;
  std::vector<std::string> rest = app.remaining();
  if (global_batch > 0) rest.push_back(fmt::format("--batch={}", global_batch));
  run::parse_run_config(rest, req.run);
  const plan::Hardware* hw = plan::find_hardware(hardware);
  if (hw == nullptr) {
    throw InvalidArgument(fmt::format("--hardware: unknown hardware '{}' (known: {})", hardware, plan::hardware_names()));
  }
  if (hardware == "cpu") {
    if (nodes != 1) throw InvalidArgument("--hardware cpu plans for this host: use --nodes 1");
    std::fprintf(stderr, "torus-plan: measuring this host's GEMM FLOP/s ...\n");
    req.hardware = plan::measure_cpu_host(ranks_per_node > 0 ? ranks_per_node : 2, req.run.precision);
  } else {
    if (ranks_per_node > 0) throw InvalidArgument("--ranks-per-node is for --hardware cpu only");
    req.hardware = *hw;
  }
  req.nodes = nodes;
  req.efficiency = efficiency;
  req.memory_fraction = memory_fraction;
  req.zero_stages = parse_list<int>(search_zero, "--search-zero");
  req.recompute = parse_list<std::string>(search_recompute, "--search-recompute");
  req.schedules = parse_list<std::string>(search_schedules, "--search-schedules");
  req.micro_batch_rows = parse_list<int64_t>(search_rows, "--search-rows");
  req.allow_offload = !no_offload;
  if (top < 1) throw InvalidArgument("--top must be >= 1");

  if (evaluate_only) {
    plan::Plan p;
    p.request = req;
    p.devices = int64_t{nodes} * req.hardware.devices_per_node;
    const plan::Candidate c = plan::evaluate_layout(req);
    p.candidates.push_back(c);
    p.evaluated = 1;
    if (json) {
      std::cout << plan::plan_json(p, 1) << "\n";
    } else {
      std::cout << plan::explain(c, p);
    }
    return c.fits ? 0 : 3;
  }
  const plan::Plan p = plan::make_plan(req);
  if (json) {
    std::cout << plan::plan_json(p, top) << "\n";
  } else {
    std::cout << plan::plan_table(p, top);
  }
  return p.best() != nullptr ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const torus::InvalidArgument& e) {
    std::fprintf(stderr, "torus-plan: error: %s\n(see torus-plan --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-plan: error: %s\n", e.what());
    return 1;
  }
}
