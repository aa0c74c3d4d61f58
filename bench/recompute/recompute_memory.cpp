// torus-bench-recompute — activation memory and step time of the reference
// GPT under each recompute policy, beside Korthikanti et al.'s formulas.
//
//   torus-bench-recompute [--seq 512] [--batch 1] [--layers 4] [--hidden 256] [--heads 8] [--vocab 8192]
//                         [--steps 5] [--warmup 2] [--threads 1] [--json FILE]
//   mpirun -np 2 torus-bench-recompute --tp 2 [--sp]   # per-rank numbers under tensor parallelism
//
// Memory is counted, not sampled: a wrapper around LibTorch's CPU allocator
// adds every allocation's size and subtracts it when freed, so "live bytes"
// are the bytes of tensors alive at that moment (not RSS, which glibc's
// free lists and page reuse blur). Two numbers per policy:
//  * per layer: one GPTBlock's forward on x [s, b, h] (requires grad), the
//    bytes still alive after it (what the autograd graph keeps for backward;
//    the block input is allocated before and not counted, its output is,
//    and stands for the next block's input) — comparable to the formulas;
//  * model: the whole GPT's forward + loss, bytes alive before backward,
//    and the peak during forward + backward, minus what was alive before.
// The formulas count 2-byte activations and 1-byte dropout masks; Torus
// keeps activations in the model's dtype (f32 here: 4 bytes) and dropout
// masks in the activation dtype (x * mask), so the "formula" column is also
// given at the run's element size: s b h (34 + 5 a s / h) x bytes / 2 plus
// one extra byte-per-element of masks (the three masks: 2 s b h and a s^2 b).
//
// Before it reports, every policy's loss and gradients are checked against
// the run without recompute (1e-6 relative); a mismatch ends with exit 2.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <c10/core/CPUAllocator.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/live_bytes.h"
#include "common/options.h"
#include "torus/comm/device_mesh.h"
#include "torus/core/host_allocator.h"
#include "torus/models/gpt.h"
#include "torus/recompute/recompute.h"

namespace {

using namespace torus;
using Clock = std::chrono::steady_clock;

bench::LiveBytesAllocator* g_counter = nullptr;

// ---- options --------------------------------------------------------------------

struct Options {
  int64_t seq = 512, batch = 1, layers = 4, hidden = 256, heads = 8, vocab = 8192;
  int steps = 5, warmup = 2, tp = 1, threads = 1;
  bool sp = false;
  std::string json;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: torus-bench-recompute [--seq 512] [--batch 1] [--layers 4] [--hidden 256] [--heads 8]\n"
               "  [--vocab 8192] [--steps 5] [--warmup 2] [--threads 1] [--tp N (mpirun -np N)] [--sp] [--json FILE]\n",
               msg);
  std::exit(1);
}

// The shared bench argument reader (bench/common/options.h).
Options parse(int argc, char** argv) {
  Options o;
  try {
    bench::Cli cli;
    cli.flag("--help,-h", [&] { usage(""); });
    bench::int_option(cli, "--seq", o.seq);
    bench::int_option(cli, "--batch", o.batch);
    bench::int_option(cli, "--layers", o.layers);
    bench::int_option(cli, "--hidden", o.hidden);
    bench::int_option(cli, "--heads", o.heads);
    bench::int_option(cli, "--vocab", o.vocab);
    bench::int_option(cli, "--steps", o.steps);
    bench::int_option(cli, "--warmup", o.warmup, 0);
    bench::int_option(cli, "--tp", o.tp);
    bench::int_option(cli, "--threads", o.threads);
    cli.flag("--sp", [&] { o.sp = true; });
    cli.option("--json", [&](const std::string& v) { o.json = v; });
    cli.parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    usage(e.what());
  }
  return o;
}

// ---- formulas (Korthikanti et al. 2022, bytes per layer at 2-byte activations) ----

struct Formula {
  double none, selective, full;
};

Formula formula(const Options& o) {
  const double s = o.seq, b = o.batch, h = o.hidden, a = o.heads, t = o.tp;
  const double sbh = s * b * h, attn = 5.0 * a * s / h;
  if (t == 1) return {sbh * (34 + attn), 34 * sbh, 2 * sbh};
  if (o.sp) return {sbh / t * (34 + attn), 34 * sbh / t, 2 * sbh / t};
  return {sbh * (10 + 24 / t + attn / t), sbh * (10 + 24 / t), 2 * sbh};
}

// ---- measurements --------------------------------------------------------------------

struct Result {
  std::string policy;
  double layer_bytes = 0;       // one block's activations kept for backward
  double model_bytes = 0;       // whole model after forward + loss
  double model_peak_bytes = 0;  // peak over forward + backward, above the start
  double step_ms = 0;           // forward + backward, median
  double loss = 0;
};

models::GPTConfig model_config(const Options& o, const recompute::Policy& policy) {
  models::GPTConfig c;
  c.vocab_size = o.vocab;
  c.max_seq_len = o.seq;
  c.num_layers = o.layers;
  c.hidden = o.hidden;
  c.num_heads = o.heads;
  c.dropout = 0.1;
  c.attention_dropout = 0.1;
  c.sequence_parallel = o.sp;
  c.recompute = policy;
  return c;
}

// Live bytes after the forward of block `layer` (mean over layers 0 and 1:
// every:2 recomputes the first and not the second).
double block_bytes(const Options& o, const recompute::Policy& policy, const parallel::ParallelGroups& groups) {
  models::GPTConfig c = model_config(o, policy);
  auto rng = std::make_shared<tp::RngTracker>(c.seed, groups.tp_rank());
  double sum = 0;
  for (int64_t layer = 0; layer < 2; ++layer) {
    auto block = std::make_shared<models::GPTBlock>(c, layer, groups, rng);
    block->train();
    const int64_t rows = o.sp ? o.seq / o.tp : o.seq;
    at::Tensor x = at::randn({rows, o.batch, o.hidden}).requires_grad_(true);
    const int64_t before = g_counter->live();
    at::Tensor y = policy.recompute_block(layer) ? recompute::run([&](const at::Tensor& in) { return block->forward(in); },
                                                                  x, {.rng_trackers = {rng}})
                                                 : block->forward(x);
    sum += static_cast<double>(g_counter->live() - before);
    y.sum().backward();  // the graph must be usable (and frees everything)
  }
  return sum / 2;
}

Result measure(const Options& o, const recompute::Policy& policy, const parallel::ParallelGroups& groups,
               const at::Tensor& tokens, const at::Tensor& labels, std::vector<at::Tensor>* grads) {
  Result r;
  r.policy = policy.name();
  r.layer_bytes = block_bytes(o, policy, groups);
  models::GPT model(model_config(o, policy), groups);
  model.train();
  std::vector<double> times;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
    // Gradients exist from the first backward on; measure with them allocated.
    if (i > 0) {
      for (auto& p : model.parameters()) p.mutable_grad() = at::zeros_like(p);
    }
    const int64_t start = g_counter->live();
    g_counter->reset_peak();
    const auto t0 = Clock::now();
    at::Tensor loss = model.loss(tokens, labels);
    const int64_t after_forward = g_counter->live();
    loss.backward();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (i >= o.warmup) {
      times.push_back(ms);
      r.model_bytes = static_cast<double>(after_forward - start);
      r.model_peak_bytes = static_cast<double>(g_counter->peak() - start);
    }
    if (i == 0) {
      r.loss = loss.item<double>();
      grads->clear();
      for (auto& p : model.parameters()) grads->push_back(p.grad().clone());
    }
  }
  std::sort(times.begin(), times.end());
  r.step_ms = times.empty() ? 0 : times[times.size() / 2];
  return r;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double mag = b.abs().max().item<double>();
  const double d = (a - b).abs().max().item<double>();
  return mag > 0 ? d / mag : d;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  torus::retain_freed_host_memory();  // step times without the page faults of fresh mappings
  at::set_num_threads(o.threads);
  g_counter = &bench::install_live_bytes_allocator();

  comm::ProcessGroupPtr world;
  std::unique_ptr<comm::DeviceMesh> mesh;
  parallel::ParallelGroups groups;
  if (o.tp > 1) {
    world = torus::init();
    if (world->size() != o.tp) usage("--tp N needs exactly N ranks");
    mesh = std::make_unique<comm::DeviceMesh>(world, std::vector<std::pair<std::string, int>>{{"tp", o.tp}});
    groups = parallel::ParallelGroups::from_mesh(*mesh);
  }
  const bool print = !world || world->rank() == 0;

  at::manual_seed(7);
  at::Tensor data = at::randint(o.vocab, {o.batch, o.seq + 1}, at::TensorOptions().dtype(at::kLong));
  at::Tensor tokens = data.narrow(1, 0, o.seq).contiguous(), labels = data.narrow(1, 1, o.seq).contiguous();

  const std::vector<recompute::Policy> policies = {recompute::Policy::none(), recompute::Policy::selective(),
                                                   recompute::Policy::every(2), recompute::Policy::full()};
  std::vector<Result> results;
  std::vector<at::Tensor> ref_grads;
  int wrong = 0;
  for (const auto& policy : policies) {
    std::vector<at::Tensor> grads;
    results.push_back(measure(o, policy, groups, tokens, labels, &grads));
    if (ref_grads.empty()) {
      ref_grads = grads;
      continue;
    }
    double worst = std::abs(results.back().loss - results.front().loss) / std::abs(results.front().loss);
    for (size_t i = 0; i < grads.size(); ++i) worst = std::max(worst, rel_diff(grads[i], ref_grads[i]));
    if (worst > 1e-6) {
      ++wrong;
      std::fprintf(stderr, "recompute %s: loss or gradients differ from no recompute by %.3e\n",
                   policy.name().c_str(), worst);
    }
  }

  const Formula f = formula(o);
  const double elem = 4.0;  // f32
  // Torus at the run's element size: the formula's 2-byte activations at elem
  // bytes, its 1-byte masks (2 s b h + a s^2 b per layer) at elem bytes too.
  const double t = o.tp, s = o.seq, b = o.batch, h = o.hidden, a = o.heads;
  const double masks_none = (o.sp ? 2 * s * b * h / t : 2 * s * b * h) + a * s * s * b / t;
  const double masks_sel = o.sp ? 2 * s * b * h / t : 2 * s * b * h;
  auto at_elem = [&](double fb, double masks) { return fb * elem / 2 + masks * elem / 2; };
  struct Row {
    double formula, torus_formula;
  };
  auto row_for = [&](const std::string& p) -> Row {
    if (p == "none") return {f.none, at_elem(f.none, masks_none)};
    if (p == "selective") return {f.selective, at_elem(f.selective, masks_sel)};
    if (p == "full") return {f.full, at_elem(f.full, 0)};
    const double half = 0.5;  // every:2 over the model: half the blocks full, half none
    return {half * (f.none + f.full), half * (at_elem(f.none, masks_none) + at_elem(f.full, 0))};
  };

  if (print) {
    std::printf("# torus-bench-recompute: GPT L=%lld h=%lld a=%lld s=%lld b=%lld vocab=%lld, tp=%d%s, f32, dropout 0.1, "
                "%d thread(s), step = forward + backward, median of %d\n",
                static_cast<long long>(o.layers), static_cast<long long>(o.hidden), static_cast<long long>(o.heads),
                static_cast<long long>(o.seq), static_cast<long long>(o.batch), static_cast<long long>(o.vocab), o.tp,
                o.sp ? " sp" : "", o.threads, o.steps);
    std::printf("# per layer: live bytes after one block's forward (counting CPU allocator), per rank\n");
    std::printf("# formula: Korthikanti et al. at 2-byte activations, 1-byte masks; at f32: the same at 4 bytes, "
                "masks at 4 bytes\n");
    std::printf("%-10s %14s %14s %14s %8s %16s %16s %10s\n", "policy", "layer MiB", "formula MiB", "at f32 MiB",
                "ratio", "model fwd MiB", "model peak MiB", "step ms");
    for (const auto& r : results) {
      const Row fr = row_for(r.policy);
      const double mib = 1024.0 * 1024.0;
      std::printf("%-10s %14.3f %14.3f %14.3f %8.3f %16.3f %16.3f %10.2f\n", r.policy.c_str(), r.layer_bytes / mib,
                  fr.formula / mib, fr.torus_formula / mib, r.layer_bytes / fr.torus_formula, r.model_bytes / mib,
                  r.model_peak_bytes / mib, r.step_ms);
    }
    std::printf("# per layer is the mean of blocks 0 and 1 (every:2 recomputes block 0 only)\n");
    std::printf("# verified: %s\n", wrong == 0 ? "every policy's loss and gradients equal no recompute (1e-6)"
                                               : "MISMATCH (see stderr)");
    if (!o.json.empty()) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& r : results) {
        const Row fr = row_for(r.policy);
        out.push_back({{"policy", r.policy}, {"seq", o.seq}, {"batch", o.batch}, {"hidden", o.hidden},
                       {"heads", o.heads}, {"layers", o.layers}, {"tp", o.tp}, {"sp", o.sp}, {"dtype", "f32"},
                       {"layer_bytes", r.layer_bytes}, {"formula_bytes", fr.formula},
                       {"formula_bytes_at_dtype", fr.torus_formula}, {"model_forward_bytes", r.model_bytes},
                       {"model_peak_bytes", r.model_peak_bytes}, {"step_ms", r.step_ms}, {"verified", wrong == 0}});
      }
      std::ofstream(o.json) << out.dump(1) << "\n";
    }
  }
  return wrong == 0 ? 0 : 2;
}
