// torus-bench-precision — step time, tokens/s and memory per rank of the
// reference GPT trained by the engine (engine::GPTTrainer) in f32, bf16 and
// fp16, in one run, beside the machine's GEMM peak for each dtype.
//
//   torus-bench-precision [--layers 4] [--hidden 256] [--heads 8] [--seq 512] [--batch 4]
//                         [--steps 6] [--warmup 2] [--threads 2] [--json FILE]
//
// Memory is live tensor bytes (bench/common/live_bytes.h, a counting CPU
// allocator), per rank:
//  * state: parameters + gradient buffers + optimizer state (and fp32
//    master weights of half-precision parameters), alive between steps;
//  * activations: the peak during a step above the state (activations kept
//    for backward, plus the step's transient buffers);
//  * total: the peak during a step.
// Time is the median step; tokens/s = tokens per step / median step time.
// The "peak" column is measure_cpu_gemm_flops (an n = 1024 GEMM on the
// same threads) of the dtype, and MFU the model FLOPs over it.
//
// Verified before reporting: every loss finite, and each half run's mean
// loss over its timed steps within 5% of f32's (the same batches and
// initialisation). A failure exits 2.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <type_traits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/live_bytes.h"
#include "common/options.h"
#include "torus/comm/process_group.h"
#include "torus/engine/gpt_model.h"
#include "torus/run/peak_flops.h"

namespace {

using namespace torus;
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t layers = 4, hidden = 256, heads = 8, seq = 512, batch = 4;
  int steps = 6, warmup = 2, threads = 2;
  std::string json;
};

constexpr const char* kUsage =
    "usage: torus-bench-precision [--layers 4] [--hidden 256] [--heads 8] [--seq 512] [--batch 4]\n"
    "  [--steps 6] [--warmup 2] [--threads 2] [--json FILE]\n"
    "The engine's GPT trained in f32, bf16 and fp16: step time, tokens/s and live bytes per rank.\n";

// The shared bench command line (bench/common/cli.h); throws
// std::invalid_argument naming the option.
Options parse(int argc, char** argv) {
  bench::Cli cli;
  cli.flag("--help,-h", [] {
    std::fputs(kUsage, stdout);
    std::exit(0);
  });
  Options o;
  bench::int_option(cli, "--layers", o.layers);
  bench::int_option(cli, "--hidden", o.hidden);
  bench::int_option(cli, "--heads", o.heads);
  bench::int_option(cli, "--seq", o.seq);
  bench::int_option(cli, "--batch", o.batch);
  bench::int_option(cli, "--steps", o.steps);
  bench::int_option(cli, "--warmup", o.warmup, 0);
  bench::int_option(cli, "--threads", o.threads);
  cli.option("--json", [&](const std::string& v) { o.json = v; });
  cli.parse(argc, argv);
  return o;
}

struct Result {
  std::string precision;
  double step_s = 0, tokens_per_s = 0, peak_flops = 0, mfu = 0;
  double state_bytes = 0, activation_bytes = 0, total_bytes = 0;
  double mean_loss = 0;
  std::vector<double> losses;
};

at::Tensor batch_of(int64_t step, const Options& o) {
  at::Generator g = tp::make_generator(1000 + static_cast<uint64_t>(step));
  return at::randint(0, 256, {o.batch, o.seq + 1}, g, at::TensorOptions().dtype(at::kLong));
}

Result run_precision(const comm::ProcessGroupPtr& world, const Options& o, const std::string& precision,
           bench::LiveBytesAllocator& live) {
  models::GPTConfig c;
  c.vocab_size = 256;
  c.max_seq_len = o.seq;
  c.num_layers = o.layers;
  c.hidden = o.hidden;
  c.num_heads = o.heads;
  c.dtype = precision == "bf16" ? at::kBFloat16 : precision == "fp16" ? at::kHalf : at::kFloat;
  Result r;
  r.precision = precision;
  const int64_t base = live.live();
  {
    engine::ParallelLayout layout;
    engine::OptimizerConfig optim;
    optim.lr = 1e-3;
    engine::TrainerOptions options;
    options.loss_scaler.initial_scale = 1024;
    engine::GPTTrainer trainer(world, c, layout, optim, options);
    std::vector<double> times, peaks;
    for (int k = 0; k < o.warmup + o.steps; ++k) {
      const at::Tensor batch = batch_of(k, o);
      const int64_t state = live.live() - base;
      live.reset_peak();
      const auto t0 = Clock::now();
      const engine::StepStats st = trainer.train_step(batch);
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (k < o.warmup) continue;
      times.push_back(dt);
      r.state_bytes = static_cast<double>(state);
      peaks.push_back(static_cast<double>(live.peak() - base));
      r.losses.push_back(st.loss);
    }
    std::sort(times.begin(), times.end());
    r.step_s = times[times.size() / 2];
    r.total_bytes = *std::max_element(peaks.begin(), peaks.end());
    r.activation_bytes = r.total_bytes - r.state_bytes;
    r.tokens_per_s = static_cast<double>(o.batch * o.seq) / r.step_s;
    r.peak_flops = run::measure_cpu_gemm_flops(c.dtype, o.threads);
    r.mfu = r.tokens_per_s * trainer.flops_per_token(o.seq) / r.peak_flops;
  }
  double sum = 0;
  for (double l : r.losses) sum += l;
  r.mean_loss = sum / static_cast<double>(r.losses.size());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "torus-bench-precision: %s\n%s", e.what(), kUsage);
    return 1;
  }
  bench::LiveBytesAllocator& live = bench::install_live_bytes_allocator();
  at::set_num_threads(o.threads);
  comm::ProcessGroupPtr world = torus::init();
  std::vector<Result> results;
  for (const char* p : {"f32", "bf16", "fp16"}) results.push_back(run_precision(world, o, p, live));

  bool ok = true;
  for (const Result& r : results) {
    for (double l : r.losses) ok &= std::isfinite(l);
    if (std::fabs(r.mean_loss - results[0].mean_loss) > 0.05 * results[0].mean_loss) {
      std::fprintf(stderr, "verification failed: %s mean loss %.4f, f32 %.4f\n", r.precision.c_str(), r.mean_loss,
                   results[0].mean_loss);
      ok = false;
    }
  }
  if (world->rank() == 0) {
    const double mib = 1024.0 * 1024.0;
    std::printf("# torus-bench-precision: GPT L=%lld h=%lld a=%lld s=%lld b=%lld vocab=256, 1 rank, %d threads, "
                "AdamW (fp32 masters and f32 main gradients for half), median of %d steps\n",
                static_cast<long long>(o.layers), static_cast<long long>(o.hidden), static_cast<long long>(o.heads),
                static_cast<long long>(o.seq), static_cast<long long>(o.batch), o.threads, o.steps);
    std::printf("%-6s %9s %10s %7s %11s %7s %11s %13s %11s %7s %10s\n", "dtype", "step ms", "tok/s", "x f32",
                "GEMM GF/s", "MFU", "state MiB", "activ. MiB", "total MiB", "x f32", "mean loss");
    for (const Result& r : results) {
      std::printf("%-6s %9.1f %10.0f %7.2f %11.1f %6.1f%% %11.1f %13.1f %11.1f %7.2f %10.4f\n", r.precision.c_str(),
                  r.step_s * 1e3, r.tokens_per_s, r.tokens_per_s / results[0].tokens_per_s, r.peak_flops / 1e9,
                  100 * r.mfu, r.state_bytes / mib, r.activation_bytes / mib, r.total_bytes / mib,
                  r.total_bytes / results[0].total_bytes, r.mean_loss);
    }
    std::printf("# %s: losses finite, half-precision mean losses within 5%% of f32\n", ok ? "verified" : "FAILED");
    if (!o.json.empty()) {
      nlohmann::ordered_json j;
      j["benchmark"] = "torus-bench-precision";
      j["config"] = {{"layers", o.layers}, {"hidden", o.hidden}, {"heads", o.heads}, {"seq", o.seq},
                     {"batch", o.batch}, {"steps", o.steps}, {"threads", o.threads}};
      j["verified"] = ok;
      for (const Result& r : results) {
        j["results"].push_back({{"precision", r.precision},
                                {"step_s", r.step_s},
                                {"tokens_per_s", r.tokens_per_s},
                                {"gemm_peak_flops", r.peak_flops},
                                {"mfu", r.mfu},
                                {"state_bytes", r.state_bytes},
                                {"activation_bytes", r.activation_bytes},
                                {"total_bytes", r.total_bytes},
                                {"mean_loss", r.mean_loss}});
      }
      std::ofstream(o.json) << j.dump(2) << "\n";
    }
  }
  return ok ? 0 : 2;
}
