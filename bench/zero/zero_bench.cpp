// torus-bench-zero — memory per rank and step time of ZeRO stages 0-3 on
// the reference GPT over dp = the world size, beside the ZeRO paper's
// formulas. Run it under mpirun (N = -np); bench/zero/run.py runs N = 2
// and 4 in one go and merges their tables.
//
//   mpirun -np 4 torus-bench-zero [--sizes 10M,50M] [--stages 0,1,2,3] [--steps 5] [--warmup 1]
//                                 [--micro 1] [--rows-per-rank 1] [--seq 64] [--threads 1]
//                                 [--main-grads] [--check] [--json FILE]
//
// Memory is counted, not sampled (bench/common/live_bytes.h): the live
// tensor bytes this rank holds after one training step (activations freed,
// optimizer state created) minus those before the trainer was built. The
// model is bf16 with fp32 masters and Adam, so the paper's K = 12 and, with
// gradients in the parameter dtype (the default here; --main-grads keeps
// Torus's f32 main gradients instead), Ψ parameters on N ranks take
//   stage 0: 16Ψ     stage 1: 4Ψ + 12Ψ/N     stage 2: 2Ψ + 14Ψ/N     stage 3: 16Ψ/N
// plus the buffers Torus states (zero.h): stage 1 keeps a gradient shard
// beside the full gradient buffer (2Ψ/N); stage 3 keeps parameters outside
// blocks (embeddings, final norm) gathered; units are padded to a multiple
// of N. "expected" = formula + those buffers, taken from the ZeRO report.
// --check exits 2 unless every measurement is within 10% of expected, and
// unless ZeRO-3's construction ("init peak": the most live bytes while the
// trainer is built) holds, beyond the shards it keeps, less than half the
// replica's bf16 parameters (Ψ bytes; it holds one unit and one parameter's
// f32 draw at a time): no rank ever holds the whole model.
//
// Step time: the median of --steps steps after --warmup, per stage, with the
// time this rank waited for ZeRO's collectives (reduce-scatter, all-gather)
// as a share of the step, and the bytes they moved per step on this rank
// (reduce-scatter input, all-gather output: --micro m shows stage 2-3's
// m-fold reduce-scatter traffic, Note [ZeRO-2 and micro-batches]). Before timing, every stage's losses are checked
// against stage 0's (1e-3 relative, bf16): a mismatch exits 2.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/live_bytes.h"
#include "common/options.h"
#include "torus/comm/process_group.h"
#include "torus/core/host_allocator.h"
#include "torus/parallel/data/zero.h"
#include "torus/engine/gpt_model.h"

namespace {

using namespace torus;
using Clock = std::chrono::steady_clock;

bench::LiveBytesAllocator* g_counter = nullptr;

struct Options {
  std::vector<std::string> sizes{"10M", "50M"};
  std::vector<int> stages{0, 1, 2, 3};
  int steps = 5, warmup = 1, micro = 1, threads = 1;
  int64_t rows_per_rank = 1, seq = 64;
  bool main_grads = false, check = false;
  std::string json;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: mpirun -np N torus-bench-zero [--sizes 10M,50M] [--stages 0,1,2,3] [--steps 5] [--warmup 1]\n"
               "  [--micro 1] [--rows-per-rank 1] [--seq 64] [--threads 1] [--main-grads] [--check] [--json FILE]\n"
               "sizes: 1M (tests), 10M, 50M, 100M\n",
               msg);
  std::exit(msg[0] ? 1 : 0);
}

Options parse(int argc, char** argv) {
  Options o;
  try {
    bench::Cli cli;
    cli.flag("--help,-h", [&] { usage(""); });
    cli.option("--sizes", [&](const std::string& v) { o.sizes = bench::split_list(v); });
    cli.option("--stages", [&](const std::string& v) {
      o.stages.clear();
      for (const auto& s : bench::split_list(v)) o.stages.push_back(static_cast<int>(bench::parse_int(s, "--stages", 0)));
    });
    bench::int_option(cli, "--steps", o.steps);
    bench::int_option(cli, "--warmup", o.warmup, 0);
    bench::int_option(cli, "--micro", o.micro);
    bench::int_option(cli, "--threads", o.threads);
    bench::int_option(cli, "--rows-per-rank", o.rows_per_rank);
    bench::int_option(cli, "--seq", o.seq);
    cli.flag("--main-grads", [&] { o.main_grads = true; });
    cli.flag("--check", [&] { o.check = true; });
    cli.option("--json", [&](const std::string& v) { o.json = v; });
    cli.parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    usage(e.what());
  }
  return o;
}

// Shapes of about the named size (the printed Ψ is exact).
models::GPTConfig model_of(const std::string& size, int64_t seq) {
  models::GPTConfig c;
  c.vocab_size = 256;
  c.max_seq_len = seq;
  c.dtype = at::kBFloat16;
  if (size == "1M") {
    c.hidden = 128, c.num_layers = 5, c.num_heads = 4;
  } else if (size == "10M") {
    c.hidden = 512, c.num_layers = 3, c.num_heads = 8;
  } else if (size == "50M") {
    c.hidden = 1024, c.num_layers = 4, c.num_heads = 16;
  } else if (size == "100M") {
    c.hidden = 1024, c.num_layers = 8, c.num_heads = 16;
  } else {
    throw std::invalid_argument("unknown size '" + size + "' (1M, 10M, 50M, 100M)");
  }
  return c;
}

at::Tensor batch_of(int64_t step, int64_t rows, int64_t seq) {
  // The same tokens in every run of every stage (a multiplicative hash).
  const at::Tensor i = at::arange(rows * (seq + 1), at::TensorOptions().dtype(at::kLong));
  return i.mul(2654435761LL).add_(step * 40503).remainder_(251).view({rows, seq + 1});
}

struct Row {
  std::string size;
  int N = 1, stage = 0;
  int64_t psi = 0;
  double measured = 0, formula = 0, buffers = 0;
  double init_peak = 0;  // most live bytes while the trainer was built
  double kept = 0;       // of which ZeRO's persistent buffers at construction (shards, kept-gathered units)
  double step_ms = 0, comm_wait_ms = 0;
  double rs_mib = 0, ag_mib = 0;  // per step: reduce-scatter input and all-gather output, this rank
  std::vector<double> losses;
};

double formula_bytes(int stage, double psi, double N, bool main_grads) {
  const double g = main_grads ? 4 : 2;  // gradient bytes per parameter
  switch (stage) {
    case 0: return (2 + g + 12) * psi;
    case 1: return (2 + g) * psi + 12 * psi / N;
    case 2: return 2 * psi + (g + 12) * psi / N;
    default: return (2 + g + 12) * psi / N;
  }
}

Row run(const comm::ProcessGroupPtr& world, const Options& o, const std::string& size, int stage) {
  const int N = world->size();
  const models::GPTConfig cfg = model_of(size, o.seq);
  engine::ParallelLayout layout;
  layout.dp = N;
  layout.num_micro = o.micro;
  layout.zero = stage;
  engine::TrainerOptions opts;
  opts.grads_in_param_dtype = !o.main_grads;
  engine::OptimizerConfig optim;
  optim.lr = 1e-4;
  Row r;
  r.size = size;
  r.N = N;
  r.stage = stage;
  const int64_t rows = o.rows_per_rank * N * o.micro;
  const int64_t before = g_counter->live();
  g_counter->reset_peak();
  {
    engine::GPTTrainer trainer(world, cfg, layout, optim, opts);
    r.init_peak = static_cast<double>(g_counter->peak() - before);
    std::vector<double> ms, wait_ms;
    double last_wait = 0;
    int64_t rs0 = 0, ag0 = 0;
    for (int k = 0; k < o.warmup + o.steps; ++k) {
      const at::Tensor batch = batch_of(k, rows, o.seq);
      const auto t0 = Clock::now();
      const engine::StepStats st = trainer.train_step(batch);
      const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      double wait = 0;
      for (const dp::Zero* z : trainer.zero_syncs()) wait += z->stats().comm_wait_seconds;
      r.losses.push_back(st.loss);
      if (k == 0) {
        r.measured = static_cast<double>(g_counter->live() - before);
        r.psi = trainer.num_parameters();
        // The buffers Torus keeps beyond the formula (zero.h).
        for (const dp::Zero* z : trainer.zero_syncs()) {
          const dp::Zero::Memory m = z->memory();
          if (stage == 1) r.buffers += static_cast<double>(m.grad_shards);
          if (stage == 3) r.buffers += static_cast<double>(m.param_full) * (1.0 - 1.0 / N);
          r.kept += static_cast<double>(m.param_full + m.param_shards + m.grad_shards + m.grad_full);
        }
      }
      if (k + 1 == o.warmup || (o.warmup == 0 && k == 0)) {
        for (const dp::Zero* z : trainer.zero_syncs()) {
          rs0 += z->stats().reduce_scatter_bytes;
          ag0 += z->stats().all_gather_bytes;
        }
      }
      if (k >= o.warmup) {
        ms.push_back(dt);
        wait_ms.push_back((wait - last_wait) * 1e3);
      }
      last_wait = wait;
    }
    int64_t rs1 = 0, ag1 = 0;
    for (const dp::Zero* z : trainer.zero_syncs()) {
      rs1 += z->stats().reduce_scatter_bytes;
      ag1 += z->stats().all_gather_bytes;
    }
    const double counted_steps = o.warmup == 0 ? std::max(o.steps - 1, 1) : o.steps;
    r.rs_mib = static_cast<double>(rs1 - rs0) / counted_steps / (1024.0 * 1024.0);
    r.ag_mib = static_cast<double>(ag1 - ag0) / counted_steps / (1024.0 * 1024.0);
    std::sort(ms.begin(), ms.end());
    std::sort(wait_ms.begin(), wait_ms.end());
    r.step_ms = ms[ms.size() / 2];
    r.comm_wait_ms = wait_ms[wait_ms.size() / 2];
  }
  r.formula = formula_bytes(stage, static_cast<double>(r.psi), N, o.main_grads);
  // Padding of units to a multiple of N: at most N - 1 elements per unit; the
  // per-parameter optimizer "step" scalars and RNG states: a few KiB.
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  torus::retain_freed_host_memory();
  at::set_num_threads(o.threads);
  g_counter = &bench::install_live_bytes_allocator();
  comm::ProcessGroupPtr world = torus::init();
  const bool print = world->rank() == 0;
  const int N = world->size();
  std::vector<Row> rows;
  bool ok = true;
  for (const auto& size : o.sizes) {
    std::vector<double> ref_losses;
    for (int stage : o.stages) {
      Row r = run(world, o, size, stage);
      if (stage == o.stages.front()) ref_losses = r.losses;
      for (size_t k = 0; k < r.losses.size(); ++k) {
        if (std::abs(r.losses[k] - ref_losses[k]) > 1e-3 * std::abs(ref_losses[k])) {
          if (print) std::fprintf(stderr, "ZeRO-%d %s: loss %g at step %zu, stage %d had %g\n", stage, size.c_str(),
                                  r.losses[k], k + 1, o.stages.front(), ref_losses[k]);
          ok = false;
        }
      }
      rows.push_back(r);
    }
  }
  // Every rank's measurement; the table shows the largest rank.
  for (auto& r : rows) {
    at::Tensor t =
        at::tensor({r.measured, r.step_ms, r.comm_wait_ms, r.init_peak}, at::TensorOptions().dtype(at::kDouble));
    world->all_reduce(t, {.op = comm::ReduceOp::kMax})->wait();
    r.measured = t[0].item<double>();
    r.step_ms = t[1].item<double>();
    r.comm_wait_ms = t[2].item<double>();
    r.init_peak = t[3].item<double>();
  }
  constexpr double MiB = 1024.0 * 1024.0;
  if (print) {
    std::printf("ZeRO memory per rank (live tensor bytes after one step; bf16 parameters, fp32 masters, Adam; %s)\n",
                o.main_grads ? "f32 main gradients" : "gradients in bf16");
    std::printf("%-5s %3s %5s %10s %11s %12s %12s %12s %7s %13s %9s %10s %6s %12s %12s\n", "size", "N", "stage", "psi",
                "formula MiB", "buffers MiB", "expected MiB", "measured MiB", "ratio", "init peak MiB", "step ms",
                "wait ms", "share", "RS MiB/step", "AG MiB/step");
  }
  nlohmann::json out = nlohmann::json::array();
  double stage0_ms = 0;
  for (const auto& r : rows) {
    const double expected = r.formula + r.buffers;
    const double ratio = r.measured / expected;
    if (r.stage == 0) stage0_ms = r.step_ms;
    if (o.check && std::abs(ratio - 1) > 0.10) {
      if (print) std::fprintf(stderr, "ZeRO-%d %s: measured %.3f x expected\n", r.stage, r.size.c_str(), ratio);
      ok = false;
    }
    // ZeRO-3 builds without the whole model (Note [Deferred initialisation]):
    // its construction never holds the replica's parameters (2 bytes each).
    if (o.check && r.stage == 3 && r.init_peak - r.kept >= static_cast<double>(r.psi)) {
      if (print) std::fprintf(stderr, "ZeRO-3 %s: construction held %.1f MiB beyond its shards\n", r.size.c_str(),
                              (r.init_peak - r.kept) / MiB);
      ok = false;
    }
    if (print) {
      std::printf("%-5s %3d %5d %10lld %11.1f %12.1f %12.1f %12.1f %7.3f %13.1f %9.1f %10.1f %5.1f%% %12.1f %12.1f\n",
                  r.size.c_str(), r.N, r.stage, static_cast<long long>(r.psi), r.formula / MiB, r.buffers / MiB,
                  expected / MiB, r.measured / MiB, ratio, r.init_peak / MiB, r.step_ms, r.comm_wait_ms,
                  100.0 * r.comm_wait_ms / r.step_ms, r.rs_mib, r.ag_mib);
    }
    out.push_back({{"size", r.size}, {"N", r.N}, {"stage", r.stage}, {"psi", r.psi}, {"formula_bytes", r.formula},
                   {"buffer_bytes", r.buffers}, {"measured_bytes", r.measured}, {"ratio", ratio}, {"init_peak_bytes", r.init_peak},
                   {"step_ms", r.step_ms}, {"comm_wait_ms", r.comm_wait_ms},
                   {"reduce_scatter_mib_per_step", r.rs_mib}, {"all_gather_mib_per_step", r.ag_mib},
                   {"step_vs_stage0", stage0_ms > 0 ? r.step_ms / stage0_ms : 0.0}, {"losses", r.losses}});
  }
  if (print && !o.json.empty()) {
    std::ofstream f(o.json);
    f << nlohmann::json{{"N", N}, {"main_grads", o.main_grads}, {"threads", o.threads}, {"rows", out}}.dump(1);
  }
  if (!ok) {
    if (print) std::fprintf(stderr, "torus-bench-zero: verification failed\n");
    return 2;
  }
  return 0;
}
