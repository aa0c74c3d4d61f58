// torus-bench-train — training throughput of the reference GPT in C++:
// data parallelism (torus::dp over the world), tensor parallelism (TP over
// the world) or one process. bench/train/run.py runs it beside the Python
// peers (torch DistributedDataParallel on gloo, and Torus DP from Python) in
// one session and prints the side-by-side table.
//
//   mpirun -np 2 torus-bench-train --mode dp --json dp.json
//   mpirun -np 2 torus-bench-train --mode dp-nosync   # the same ranks and batch, no gradient sync
//   mpirun -np 2 torus-bench-train --mode tp
//   torus-bench-train --mode single --threads 2
//
// dp-nosync is the limit a data-parallel run can reach on this machine: every
// rank computes its part of the batch exactly as in dp, under the same
// contention for cores and memory, but no gradient is ever communicated (the
// replicas drift apart, so only the step-0 loss is verified).
//
// Every run verifies before it reports: the step-0 loss equals the loss of a
// single-process model on the same global batch (rank 0 computes it; 1e-4
// relative in f32), all losses are finite, and after the last step every data-
// parallel replica holds the same parameters. A step is forward, backward
// (with the gradient all-reduces overlapped), AdamW step and zero_grad;
// tokens/s = global tokens per step x steps / wall time between two barriers.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <torch/optim/adamw.h>

#include "torus/comm/shared_host.h"
#include "torus/optim/adamw.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "torus/comm/device_mesh.h"
#include "torus/core/host_allocator.h"
#include "torus/models/gpt.h"
#include "torus/parallel/data/ddp.h"
#include "torus/parallel/tensor/random.h"

namespace {

using namespace torus;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string mode = "dp";  // dp | dp-nosync | tp | single
  int64_t layers = 4, hidden = 256, heads = 8, seq = 128, vocab = 8192;
  int64_t batch = 8;  // global batch in sequences
  int steps = 10, warmup = 3, threads = 1;
  double bucket_mb = 25.0;
  bool sp = false;
  std::string optimizer = "fused";  // fused (torus::optim::AdamW) | torch (torch::optim::AdamW)
  std::string zero_grad = "none";   // none: DDP grads set to None between steps | zero: buckets zeroed
  std::string host_alloc = "retain";  // retain: torus::retain_freed_host_memory() | default: glibc's own
  std::string buckets = "shared";     // shared: DDP buckets in shared host memory | heap: ordinary tensors
                                      // (shared too where torus::init installed the shared host allocator)
  std::string json;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: torus-bench-train [--mode dp|dp-nosync|tp|single] [--layers 4] [--hidden 256] [--heads 8]\n"
               "  [--seq 128] [--vocab 8192] [--batch 8 (global)] [--steps 10] [--warmup 3] [--threads 1]\n"
               "  [--bucket-mb 25] [--sp] [--optimizer fused|torch] [--zero-grad none|zero]\n"
               "  [--host-alloc retain|default] [--buckets shared|heap] [--json FILE]\n",
               msg);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--mode")
      o.mode = value();
    else if (a == "--layers")
      o.layers = std::stoll(value());
    else if (a == "--hidden")
      o.hidden = std::stoll(value());
    else if (a == "--heads")
      o.heads = std::stoll(value());
    else if (a == "--seq")
      o.seq = std::stoll(value());
    else if (a == "--vocab")
      o.vocab = std::stoll(value());
    else if (a == "--batch")
      o.batch = std::stoll(value());
    else if (a == "--steps")
      o.steps = std::stoi(value());
    else if (a == "--warmup")
      o.warmup = std::stoi(value());
    else if (a == "--threads")
      o.threads = std::stoi(value());
    else if (a == "--bucket-mb")
      o.bucket_mb = std::stod(value());
    else if (a == "--sp")
      o.sp = true;
    else if (a == "--optimizer")
      o.optimizer = value();
    else if (a == "--zero-grad")
      o.zero_grad = value();
    else if (a == "--host-alloc")
      o.host_alloc = value();
    else if (a == "--buckets")
      o.buckets = value();
    else if (a == "--json")
      o.json = value();
    else if (a == "--help" || a == "-h")
      usage("");
    else
      usage(("unknown option " + a).c_str());
  }
  if (o.optimizer != "fused" && o.optimizer != "torch") usage("--optimizer must be fused or torch");
  if (o.zero_grad != "none" && o.zero_grad != "zero") usage("--zero-grad must be none or zero");
  if (o.host_alloc != "retain" && o.host_alloc != "default") usage("--host-alloc must be retain or default");
  if (o.buckets != "shared" && o.buckets != "heap") usage("--buckets must be shared or heap");
  if (o.mode != "dp" && o.mode != "dp-nosync" && o.mode != "tp" && o.mode != "single") {
    usage("--mode must be dp, dp-nosync, tp or single");
  }
  return o;
}

// The same learnable stream as the tests and the Python peer: random first
// tokens (CPU generator seeded 100 + step), then t' = (3 t + 7) mod vocab.
at::Tensor batch_tokens(const Options& o, int step) {
  at::Generator g = tp::make_generator(100 + step);
  at::Tensor d = at::empty({o.batch, o.seq + 1}, at::TensorOptions().dtype(at::kLong)).random_(0, o.vocab, g);
  for (int64_t i = 1; i < d.size(1); ++i) d.select(1, i).copy_((d.select(1, i - 1) * 3 + 7) % o.vocab);
  return d;
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.host_alloc == "retain") retain_freed_host_memory();  // before the first large allocation
  at::set_num_threads(o.threads);
  auto world = torus::init();
  const int n = world->size(), rank = world->rank();
  const bool sync = o.mode != "dp-nosync";
  const int dp = o.mode.rfind("dp", 0) == 0 ? n : 1, tpn = o.mode == "tp" ? n : 1;
  if (o.mode == "single" && n != 1) usage("--mode single runs on one rank");
  if (o.batch % dp != 0) usage("--batch must be divisible by the number of ranks in dp mode");

  comm::DeviceMesh mesh(world, {{"dp", dp}, {"tp", tpn}});
  const auto groups = parallel::ParallelGroups::from_mesh(mesh);
  models::GPTConfig cfg = models::GPTConfig::small();
  cfg.num_layers = o.layers;
  cfg.hidden = o.hidden;
  cfg.num_heads = o.heads;
  cfg.max_seq_len = o.seq;
  cfg.vocab_size = o.vocab;
  cfg.sequence_parallel = o.sp;

  auto model = std::make_shared<models::GPT>(cfg, groups);
  std::unique_ptr<dp::DistributedDataParallel> ddp;
  if ((dp > 1 && sync) || o.sp) {
    dp::DDPOptions d;
    d.bucket_cap_bytes = static_cast<int64_t>(o.bucket_mb * (1 << 20));
    d.shared_host_buckets = o.buckets == "shared";
    ddp = std::make_unique<dp::DistributedDataParallel>(model, groups, d);
  }
  // AdamW, lr 3e-4, weight decay 0.1 on every parameter (as the Python peers).
  std::unique_ptr<torch::optim::AdamW> torch_opt;
  std::unique_ptr<optim::AdamW> fused_opt;
  if (o.optimizer == "torch") {
    torch_opt = std::make_unique<torch::optim::AdamW>(model->parameters(),
                                                      torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
  } else {
    fused_opt = std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{model->parameters(), 0.1}},
                                               optim::AdamWOptions{.lr = 3e-4});
  }
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();

  // Reference loss of step 0 (rank 0, one process, no communication).
  double ref_loss0 = 0;
  if (rank == 0) {
    models::GPTConfig single = cfg;
    single.sequence_parallel = false;
    models::GPT ref(single);
    at::Tensor d = batch_tokens(o, 0);
    at::NoGradGuard ng;
    ref_loss0 = ref.loss(d.narrow(1, 0, o.seq).contiguous(), d.narrow(1, 1, o.seq).contiguous()).item<double>();
  }

  std::vector<double> losses, step_s;
  // Per-phase times (seconds) of every step: forward, backward (with the
  // overlapped gradient sync and its finish), optimizer step, zero_grad.
  std::vector<double> phase_s[4];
  Clock::time_point t0;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    if (step == o.warmup) {
      world->barrier()->wait();
      t0 = Clock::now();
    }
    auto s0 = Clock::now();
    at::Tensor d = batch_tokens(o, step).chunk(dp, 0)[groups.dp_rank()];
    at::Tensor loss = model->loss(d.narrow(1, 0, o.seq).contiguous(), d.narrow(1, 1, o.seq).contiguous());
    auto s1 = Clock::now();
    loss.backward();
    auto s2 = Clock::now();
    if (torch_opt) {
      torch_opt->step();
    } else {
      fused_opt->step();
    }
    auto s3 = Clock::now();
    if (ddp) {
      ddp->zero_grad(o.zero_grad == "none");
    } else if (torch_opt) {
      torch_opt->zero_grad();
    } else {
      fused_opt->zero_grad();
    }
    auto s4 = Clock::now();
    step_s.push_back(seconds(s4 - s0));
    if (step >= o.warmup) {
      phase_s[0].push_back(seconds(s1 - s0));
      phase_s[1].push_back(seconds(s2 - s1));
      phase_s[2].push_back(seconds(s3 - s2));
      phase_s[3].push_back(seconds(s4 - s3));
    }
    losses.push_back(loss.item<double>());
  }
  world->barrier()->wait();
  const double wall = seconds(Clock::now() - t0);

  // --- verification ------------------------------------------------------------
  at::Tensor l = at::tensor(losses, at::TensorOptions().dtype(at::kDouble));
  if (dp > 1) groups.dp->all_reduce(l, {.op = comm::ReduceOp::kAvg})->wait();
  bool finite = at::isfinite(l).all().item<bool>();
  double loss0_diff = rank == 0 ? std::abs(l[0].item<double>() - ref_loss0) / std::abs(ref_loss0) : 0.0;
  // Replicas agree: per-parameter sums, min and max over dp.
  std::vector<at::Tensor> sums;
  for (const auto& p : model->parameters()) sums.push_back(p.detach().to(at::kDouble).sum().reshape({1}));
  at::Tensor hi = at::cat(sums), lo = hi.clone();
  if (dp > 1) {
    groups.dp->all_reduce(hi, {.op = comm::ReduceOp::kMax})->wait();
    groups.dp->all_reduce(lo, {.op = comm::ReduceOp::kMin})->wait();
  }
  const double replica_diff = sync ? (hi - lo).abs().max().item<double>() : 0.0;  // no-sync replicas drift
  at::Tensor ok = at::tensor({finite && loss0_diff <= 1e-4 && replica_diff <= 1e-6 ? 1 : 0}, at::kInt);
  world->all_reduce(ok, {.op = comm::ReduceOp::kMin})->wait();
  const bool verified = ok.item<int>() == 1;

  std::vector<double> measured(step_s.begin() + o.warmup, step_s.end());
  std::sort(measured.begin(), measured.end());
  const double median_ms = 1e3 * measured[measured.size() / 2];
  double phase_ms[4];
  for (int k = 0; k < 4; ++k) {
    std::sort(phase_s[k].begin(), phase_s[k].end());
    phase_ms[k] = 1e3 * phase_s[k][phase_s[k].size() / 2];
  }
  const double tokens_per_step = static_cast<double>(o.batch * o.seq);
  const double tps = tokens_per_step * o.steps / wall;
  const auto stats = ddp ? ddp->stats() : dp::DistributedDataParallel::Stats{};
  if (rank == 0) {
    char line[2048];
    std::snprintf(line, sizeof(line),
                  "{\"impl\": \"torus-cpp\", \"mode\": \"%s%s\", \"host_alloc\": \"%s\", \"shared_host_alloc\": %s, \"ranks\": %d, \"threads\": %d, \"dp\": %d, "
                  "\"tp\": %d, \"layers\": %lld, \"hidden\": %lld, \"heads\": %lld, \"seq\": %lld, \"vocab\": %lld, "
                  "\"global_batch\": %lld, \"params\": %lld, \"steps\": %d, \"warmup\": %d, \"wall_s\": %.6f, "
                  "\"step_ms_mean\": %.3f, \"step_ms_median\": %.3f, \"forward_ms\": %.3f, \"backward_ms\": %.3f, "
                  "\"optimizer_ms\": %.3f, \"zero_grad_ms\": %.3f, \"tokens_per_s\": %.1f, \"loss_first\": %.6f, "
                  "\"loss_last\": %.6f, \"loss0_rel_diff\": %.3e, \"replica_diff\": %.3e, \"buckets\": %zu, "
                  "\"buckets_overlapped\": %lld, \"verified\": %s}",
                  o.mode.c_str(), o.sp ? "+sp" : "", o.host_alloc.c_str(),
                  comm::shared_host_allocator_installed() ? "true" : "false", n, o.threads, dp, tpn, (long long)o.layers, (long long)o.hidden,
                  (long long)o.heads, (long long)o.seq, (long long)o.vocab, (long long)o.batch, (long long)params,
                  o.steps, o.warmup, wall, 1e3 * wall / o.steps, median_ms, phase_ms[0], phase_ms[1], phase_ms[2],
                  phase_ms[3], tps, l[0].item<double>(),
                  l[l.size(0) - 1].item<double>(), loss0_diff, replica_diff, ddp ? ddp->buckets().size() : size_t{0},
                  (long long)stats.buckets_started_in_backward, verified ? "true" : "false");
    std::printf("%s\n", line);
    if (!o.json.empty()) std::ofstream(o.json) << line << "\n";
    if (!verified) {
      std::fprintf(stderr,
                   "torus-bench-train: verification FAILED (finite %d, step-0 loss diff %.3e, replica diff %.3e)\n",
                   finite, loss0_diff, replica_diff);
    }
  }
  return verified ? 0 : 1;
}
