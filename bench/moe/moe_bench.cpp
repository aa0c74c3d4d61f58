// torus-bench-moe — step time, tokens/s and drops of the mixture-of-experts
// layer (torus/parallel/expert/moe.h) at several capacity factors, with a
// balanced and a skewed router, over expert parallelism ep = the world size
// (the same total number of experts on every rank count), beside a dense MLP
// of the same active FLOPs run on the same tokens in the same run.
//
//   mpirun -np N torus-bench-moe [--experts 8] [--top-k 2] [--hidden 256] [--ffn 512] [--seq 512] [--batch 2]
//                                [--capacities 1.0,1.25,2.0,dropless] [--routers balanced,skewed] [--skew 1.0]
//                                [--ep N] [--steps 8] [--warmup 2] [--threads 1] [--goal 1.25] [--no-dense]
//                                [--no-probe] [--commit SHA] [--json FILE]
//
// bench/moe/run.sh runs it on 1, 2 and 4 ranks and merges the results.
//
// Every rank routes its own seq x batch tokens (its rows of the micro-batch:
// the data group is dp x ep); each configuration builds a fresh layer and
// times --steps steps after --warmup, one step = the layer's forward and
// backward (a fixed random output gradient; the auxiliary loss, weight 0.01,
// enters backward as in training). Before each step every rank waits in a
// world barrier; a step's time is the slowest rank's. Reported per row:
//  * step ms: the median over steps of the slowest rank's step time;
//  * tokens/s: the tokens of all ranks / step time;
//  * a2a ms, a2a %: the time in the token all_to_alls (forward and backward,
//    waiting included; ep::token_exchange_seconds()), mean over ranks,
//    and its share of the step (median over steps); zero on one rank;
//  * drop %, imbalance: from MoELayer::end_step() (over the whole token
//    group, the same on every rank): assignments over capacity / k x tokens,
//    and max / mean of the assignments per expert before drops;
//  * vs dense: step time / the dense reference's step time.
//
// Routers. balanced: the layer's random initialisation on N(0, 1) inputs.
// skewed: rows 0 and 1 of the router get --skew x d added (d a fixed random
// unit vector, the same on every rank) and the inputs a common component 2d,
// so that for most tokens experts 0 and 1 are the top two (on ep > 1 they
// both live on ep rank 0).
//
// Dense reference ("machine limit"): h -> k x f -> h (at::linear, tanh GELU,
// at::linear, with biases), the FLOPs of one token's k experts, on the same
// tokens with the same output gradient, no communication: what the MoE
// step would cost if routing, permutation and exchange were free and the
// load perfectly balanced.
//
// Goal (issue): dropless costs at most --goal (1.25) x the step time of
// capacity factor 1.25 on the balanced router; printed with PASS/FAIL (the
// exit status does not depend on it).
//
// Verification, before anything is reported: outputs and input gradients
// are finite on every rank; every step's statistics count k x tokens
// assignments; the drops are exactly what the capacity C = ceil(cf x k x
// tokens / E) leaves (sum over experts of max(0, load - C)); dropless drops
// nothing; the skewed router at capacity factor 1.0 drops something and is
// imbalanced (> 1.5). A failed check prints it and exits 2 (1 on error).
//
// JSON (--json/--out, rank 0): {program, command, commit, date, ranks, ep,
// dp, config, probe, rows, goal, verified}.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/membw.h"
#include "common/options.h"
#include "torus/comm/context.h"
#include "torus/comm/device_mesh.h"
#include "torus/comm/process_group.h"
#include "torus/core/host_allocator.h"
#include "torus/parallel/expert/moe.h"
#include "torus/parallel/expert/routing_stats.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/random.h"

namespace {

using namespace torus;
using Clock = std::chrono::steady_clock;

// ---- options --------------------------------------------------------------------

struct Options {
  int64_t experts = 8, top_k = 2, hidden = 256, ffn = 512, seq = 512, batch = 2;
  std::vector<double> capacities{1.0, 1.25, 2.0, 0.0};  // 0: dropless
  std::vector<std::string> routers{"balanced", "skewed"};
  double skew = 1.0;
  double goal = 1.25;
  int ep = 0;  // 0: the world size
  int steps = 8, warmup = 2, threads = 1;
  bool dense = true, probe = true;
  std::string commit = "unknown";
  std::string json = "bench/results/moe.json";
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s%susage: mpirun -np N torus-bench-moe [options]\n"
               "  --experts 8          total experts E (the same on every rank count)\n"
               "  --top-k 2            experts per token k\n"
               "  --hidden 256         model width h\n"
               "  --ffn 512            each expert's MLP width f\n"
               "  --seq 512 --batch 2  tokens per rank: seq x batch\n"
               "  --capacities LIST    capacity factors; 0 or 'dropless' for dropless (default 1.0,1.25,2.0,dropless)\n"
               "  --routers LIST       balanced,skewed (default both)\n"
               "  --skew 1.0           how strongly the skewed router favours experts 0 and 1\n"
               "  --ep N               expert-parallel size (default: the world size; dp = world / ep)\n"
               "  --steps 8 --warmup 2 timed and untimed steps per configuration (median reported)\n"
               "  --threads 1          intra-op threads per rank\n"
               "  --goal 1.25          the goal: dropless step time <= goal x capacity 1.25's (balanced)\n"
               "  --no-dense           skip the dense reference (then no 'vs dense' column)\n"
               "  --no-probe           skip the memcpy probe\n"
               "  --commit SHA         the commit recorded in the JSON (default 'unknown')\n"
               "  --json FILE, --out FILE  results (rank 0; default bench/results/moe.json; '' for none)\n"
               "Exit status: 0 when every check passed, 2 when one failed, 1 on error.\n",
               msg, msg[0] ? "\n" : "");
  std::exit(msg[0] ? 1 : 0);
}

Options parse(int argc, char** argv) {
  Options o;
  try {
    bench::Cli cli;
    bool help = false;
    cli.flag("--help,-h", [&] { help = true; });
    bench::int_option(cli, "--experts", o.experts);
    bench::int_option(cli, "--top-k", o.top_k);
    bench::int_option(cli, "--hidden", o.hidden);
    bench::int_option(cli, "--ffn", o.ffn);
    bench::int_option(cli, "--seq", o.seq);
    bench::int_option(cli, "--batch", o.batch);
    bench::int_option(cli, "--ep", o.ep);
    bench::int_option(cli, "--steps", o.steps);
    bench::int_option(cli, "--warmup", o.warmup, 0);
    bench::int_option(cli, "--threads", o.threads);
    cli.option("--capacities", [&](const std::string& v) {
      o.capacities.clear();
      for (const auto& s : bench::split_list(v)) {
        if (s == "dropless" || s == "none") {
          o.capacities.push_back(0.0);
        } else {
          o.capacities.push_back(bench::parse_nonnegative(s, "--capacities"));
        }
      }
      if (o.capacities.empty()) throw std::invalid_argument("--capacities needs at least one value");
    });
    cli.option("--routers", [&](const std::string& v) {
      o.routers = bench::split_list(v);
      if (o.routers.empty()) throw std::invalid_argument("--routers needs at least one of balanced,skewed");
      for (const auto& r : o.routers) {
        if (r != "balanced" && r != "skewed") {
          throw std::invalid_argument("--routers: unknown router '" + r + "' (balanced, skewed)");
        }
      }
    });
    cli.option("--skew", [&](const std::string& v) { o.skew = bench::parse_nonnegative(v, "--skew"); });
    cli.option("--goal", [&](const std::string& v) { o.goal = bench::parse_nonnegative(v, "--goal"); });
    cli.flag("--no-dense", [&] { o.dense = false; });
    cli.flag("--no-probe", [&] { o.probe = false; });
    cli.option("--commit", [&](const std::string& v) { o.commit = v; });
    cli.option("--json,--out", [&](const std::string& v) { o.json = v; });
    cli.parse(argc, argv);
    if (help) usage("");
    if (o.top_k > o.experts) throw std::invalid_argument("--top-k must be at most --experts");
  } catch (const std::invalid_argument& e) {
    usage(e.what());
  }
  return o;
}

// ---- helpers --------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.empty() || a.find_first_of(" \t\"'$\\") != std::string::npos) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    if (!s.empty()) s += ' ';
    s += a;
  }
  return s;
}

std::string capacity_label(double cf) {
  if (cf < 0) return "-";
  if (cf == 0) return "dropless";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", cf);
  return buf;
}

// ---- measurements ----------------------------------------------------------------

struct Row {
  int ep = 1, ranks = 1;
  std::string router;           // "balanced", "skewed", or "dense" (the reference)
  double capacity_factor = -1;  // 0: dropless; -1: the dense reference
  int64_t capacity = -1;        // C, assignments per expert; -1: dropless or dense
  double step_ms = 0;           // median over steps of the slowest rank's step
  double a2a_ms = 0;            // median over steps of the mean over ranks of the token all_to_alls
  double a2a_share = 0;         // median over steps of a2a / step
  double tokens_per_s = 0;      // all ranks' tokens / step_ms
  double assignments = 0, dropped = 0;  // summed over the timed steps
  double drop_rate = 0, imbalance = 0, aux_loss = 0;
  std::vector<double> tokens_per_expert;  // summed over the timed steps
  std::vector<double> steps_ms;           // every timed step (slowest rank)
};

// Counts failed checks; `print`: this rank reports them.
struct Checks {
  int rank = 0;
  int failed = 0;
  void fail(const std::string& what, bool print) {
    ++failed;
    if (print) std::fprintf(stderr, "torus-bench-moe (rank %d): check failed: %s\n", rank, what.c_str());
  }
};

// Per-step times of this rank -> the row's step_ms, a2a_ms, a2a_share (one
// pair of collectives per configuration, after its timed steps).
void reduce_times(const comm::ProcessGroupPtr& world, const std::vector<double>& step_s,
                  const std::vector<double>& a2a_s, Row& r) {
  const auto dopts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor step = at::tensor(step_s, dopts).contiguous();
  at::Tensor a2a = at::tensor(a2a_s, dopts).contiguous();
  world->all_reduce(step, {.op = comm::ReduceOp::kMax})->wait();
  world->all_reduce(a2a, {.op = comm::ReduceOp::kSum})->wait();
  const double* sp = step.data_ptr<double>();
  const double* ap = a2a.data_ptr<double>();
  const double n = static_cast<double>(world->size());
  std::vector<double> ms, a2a_ms, share;
  for (size_t i = 0; i < step_s.size(); ++i) {
    ms.push_back(sp[i] * 1e3);
    a2a_ms.push_back(ap[i] / n * 1e3);
    share.push_back(sp[i] > 0 ? ap[i] / n / sp[i] : 0.0);
  }
  r.steps_ms = ms;
  r.step_ms = median(ms);
  r.a2a_ms = median(a2a_ms);
  r.a2a_share = median(share);
}

bool all_finite(const at::Tensor& t) { return t.defined() && at::isfinite(t).all().item<bool>(); }

// Rows 0 and 1 of the router += skew x dir (the same on every rank).
void skew_router(ep::MoELayer& layer, const at::Tensor& dir, double skew) {
  at::NoGradGuard no_grad;
  auto params = layer.named_parameters();
  at::Tensor* w = params.find("router.weight");
  if (w == nullptr) throw std::runtime_error("the MoE layer has no parameter 'router.weight'");
  const int64_t rows = std::min<int64_t>(2, w->size(0));
  w->narrow(0, 0, rows).add_(dir.unsqueeze(0).to(w->scalar_type()) * skew);
}

struct Inputs {
  at::Tensor balanced;  // [s, b, h] N(0, 1), this rank's own
  at::Tensor skewed;    // balanced + 2 dir
  at::Tensor grad;      // [s, b, h] the output gradient
  at::Tensor dir;       // [h] unit vector, the same on every rank
};

Row run_moe(const comm::ProcessGroupPtr& world, const parallel::ParallelGroups& groups, const Options& o,
            const std::string& router, double cf, const Inputs& in, Checks& checks) {
  const bool leader = world->rank() == 0;
  const int64_t global_tokens = o.seq * o.batch * world->size();
  ep::MoEConfig cfg;
  cfg.num_experts = o.experts;
  cfg.top_k = o.top_k;
  cfg.capacity_factor = cf;
  cfg.hidden = o.hidden;
  cfg.ffn_hidden = o.ffn;
  cfg.aux_loss_weight = 0.01;
  auto layer = std::make_shared<ep::MoELayer>(cfg, "bench.moe", /*layer=*/0, groups, /*sequence_parallel=*/false,
                                                  std::make_shared<tp::RngTracker>(1234, 0));
  layer->train();
  const bool skewed = router == "skewed";
  if (skewed) skew_router(*layer, in.dir, o.skew);
  std::vector<at::Tensor> params = layer->parameters();

  Row r;
  r.ranks = world->size();
  r.ep = parallel::group_size(groups.ep);
  r.router = router;
  r.capacity_factor = cf;
  r.capacity = cfg.capacity(global_tokens);
  r.tokens_per_expert.assign(static_cast<size_t>(o.experts), 0.0);
  const std::string name = router + " router, capacity " + capacity_label(cf);

  at::Tensor x = (skewed ? in.skewed : in.balanced).clone().requires_grad_(true);
  std::vector<double> step_s, a2a_s;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    x.mutable_grad() = at::Tensor();
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    world->barrier()->wait();
    const double a0 = ep::token_exchange_seconds();
    const auto t0 = Clock::now();
    at::Tensor y = layer->forward(x);
    y.backward(in.grad);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double a2a = ep::token_exchange_seconds() - a0;
    const ep::LayerRoutingStats st = layer->end_step(false);
    if (i < o.warmup) continue;
    step_s.push_back(dt);
    a2a_s.push_back(a2a);

    // The statistics are the whole token group's: the same on every rank.
    const double expected_assignments = static_cast<double>(o.top_k * global_tokens);
    double load = 0, over = 0;
    for (int64_t e = 0; e < o.experts && e < static_cast<int64_t>(st.tokens_per_expert.size()); ++e) {
      const double c = st.tokens_per_expert[static_cast<size_t>(e)];
      load += c;
      if (r.capacity >= 0) over += std::max(0.0, c - static_cast<double>(r.capacity));
      r.tokens_per_expert[static_cast<size_t>(e)] += c;
    }
    if (st.micro_batches != 1 || static_cast<int64_t>(st.tokens_per_expert.size()) != o.experts ||
        std::abs(st.assignments - expected_assignments) > 0.5 || std::abs(load - expected_assignments) > 0.5) {
      checks.fail(name + ": step statistics count " + std::to_string(st.assignments) + " assignments (" +
                      std::to_string(load) + " over experts, " + std::to_string(st.micro_batches) +
                      " micro-batches), expected " + std::to_string(expected_assignments),
                  leader);
    }
    if (std::abs(st.dropped - over) > 0.5) {
      checks.fail(name + ": " + std::to_string(st.dropped) + " assignments dropped, capacity " +
                      std::to_string(r.capacity) + " leaves " + std::to_string(over),
                  leader);
    }
    r.assignments += st.assignments;
    r.dropped += st.dropped;
    r.aux_loss += st.aux_loss;

    if (i + 1 == o.warmup + o.steps) {
      if (!all_finite(y) || !all_finite(x.grad())) checks.fail(name + ": output or input gradient not finite", true);
      for (const auto& item : layer->named_parameters()) {
        if (item.value().grad().defined() && !all_finite(item.value().grad())) {
          checks.fail(name + ": gradient of " + item.key() + " not finite", true);
        }
      }
    }
  }
  reduce_times(world, step_s, a2a_s, r);
  r.tokens_per_s = r.step_ms > 0 ? static_cast<double>(global_tokens) / (r.step_ms * 1e-3) : 0.0;
  r.drop_rate = r.assignments > 0 ? r.dropped / r.assignments : 0.0;
  r.aux_loss /= std::max(o.steps, 1);
  ep::LayerRoutingStats total;
  total.tokens_per_expert = r.tokens_per_expert;
  r.imbalance = total.imbalance();

  if (cf == 0 && r.dropped != 0) checks.fail(name + ": dropless dropped " + std::to_string(r.dropped), leader);
  if (skewed && o.skew > 0 && cf == 1.0 && !(r.dropped > 0)) {
    checks.fail(name + ": the skewed router dropped nothing at capacity factor 1.0", leader);
  }
  if (skewed && o.skew > 0 && !(r.imbalance > 1.5)) {
    checks.fail(name + ": the skewed router is balanced (imbalance " + std::to_string(r.imbalance) + ")", leader);
  }
  return r;
}

// h -> k f -> h on this rank's tokens: the active FLOPs of the MoE layer, no routing, no exchange.
Row run_dense(const comm::ProcessGroupPtr& world, const Options& o, const Inputs& in, Checks& checks) {
  const int64_t width = o.top_k * o.ffn;
  const int64_t global_tokens = o.seq * o.batch * world->size();
  at::manual_seed(4321);
  at::Tensor w1 = (at::randn({width, o.hidden}) * 0.02).requires_grad_(true);
  at::Tensor b1 = at::zeros({width}).requires_grad_(true);
  at::Tensor w2 = (at::randn({o.hidden, width}) * 0.02).requires_grad_(true);
  at::Tensor b2 = at::zeros({o.hidden}).requires_grad_(true);
  std::vector<at::Tensor> params{w1, b1, w2, b2};

  Row r;
  r.ranks = world->size();
  r.ep = 0;  // set by the caller
  r.router = "dense";
  at::Tensor x = in.balanced.clone().requires_grad_(true);
  std::vector<double> step_s, a2a_s;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    x.mutable_grad() = at::Tensor();
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    world->barrier()->wait();
    const auto t0 = Clock::now();
    at::Tensor y = at::linear(at::gelu(at::linear(x, w1, b1), "tanh"), w2, b2);
    y.backward(in.grad);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i < o.warmup) continue;
    step_s.push_back(dt);
    a2a_s.push_back(0.0);
    if (i + 1 == o.warmup + o.steps && (!all_finite(y) || !all_finite(x.grad()) || !all_finite(w1.grad()))) {
      checks.fail("dense reference: output or gradients not finite", true);
    }
  }
  reduce_times(world, step_s, a2a_s, r);
  r.tokens_per_s = r.step_ms > 0 ? static_cast<double>(global_tokens) / (r.step_ms * 1e-3) : 0.0;
  return r;
}

int run(const comm::ProcessGroupPtr& world, const Options& o, const std::optional<bench::MemcpyProbe>& probe,
        const std::string& command) {
  const int N = world->size();
  const int rank = world->rank();
  const bool leader = rank == 0;
  const int ep = o.ep > 0 ? o.ep : N;
  if (N % ep != 0) throw std::invalid_argument("--ep " + std::to_string(ep) + " does not divide the world size " +
                                               std::to_string(N));
  if (o.experts % ep != 0) {
    throw std::invalid_argument("--experts " + std::to_string(o.experts) + " is not a multiple of ep " +
                                std::to_string(ep));
  }
  const int dp = N / ep;

  comm::DeviceMesh mesh(world, std::vector<std::pair<std::string, int>>{{"dp", dp}, {"ep", ep}});
  parallel::ParallelGroups groups = parallel::ParallelGroups::from_mesh(mesh);
  for (auto* g : {&groups.tp, &groups.dp, &groups.dp_tp, &groups.ep, &groups.tokens, &groups.expert_dp,
                  &groups.expert_dp_tp}) {
    if (*g && (*g)->size() == 1) *g = nullptr;
  }

  Inputs in;
  at::manual_seed(99);
  in.dir = at::randn({o.hidden});
  in.dir = in.dir / in.dir.norm();
  at::manual_seed(1000 + static_cast<uint64_t>(rank));
  in.balanced = at::randn({o.seq, o.batch, o.hidden});
  in.grad = at::randn({o.seq, o.batch, o.hidden});
  in.skewed = in.balanced + in.dir * 2.0;

  Checks checks;
  checks.rank = rank;
  std::vector<Row> rows;
  std::optional<Row> dense;
  if (o.dense) {
    dense = run_dense(world, o, in, checks);
    dense->ep = ep;
  }
  for (const auto& router : o.routers) {
    for (double cf : o.capacities) rows.push_back(run_moe(world, groups, o, router, cf, in, checks));
  }

  // Every rank's failures decide every rank's exit status.
  at::Tensor bad = at::full({1}, static_cast<double>(checks.failed), at::TensorOptions().dtype(at::kDouble));
  world->all_reduce(bad, {.op = comm::ReduceOp::kSum})->wait();
  const bool verified = bad.item<double>() == 0;

  // The goal: dropless vs capacity 1.25, balanced router.
  const Row* cf125 = nullptr;
  const Row* dropless = nullptr;
  for (const auto& r : rows) {
    if (r.router != "balanced") continue;
    if (std::abs(r.capacity_factor - 1.25) < 1e-9) cf125 = &r;
    if (r.capacity_factor == 0) dropless = &r;
  }
  const bool have_goal = cf125 != nullptr && dropless != nullptr && cf125->step_ms > 0;
  const double goal_ratio = have_goal ? dropless->step_ms / cf125->step_ms : 0.0;
  const bool goal_pass = have_goal && goal_ratio <= o.goal;

  const int64_t tokens_per_rank = o.seq * o.batch;
  if (leader) {
    std::printf("# torus-bench-moe: E=%lld k=%lld h=%lld f=%lld, %lld tokens per rank (s=%lld b=%lld), %d rank(s), "
                "ep=%d dp=%d, f32, %d thread(s) per rank\n",
                static_cast<long long>(o.experts), static_cast<long long>(o.top_k), static_cast<long long>(o.hidden),
                static_cast<long long>(o.ffn), static_cast<long long>(tokens_per_rank), static_cast<long long>(o.seq),
                static_cast<long long>(o.batch), N, ep, dp, o.threads);
    std::printf("# step = forward + backward of the layer; median over %d steps (after %d warm-up) of the slowest "
                "rank; a2a = token all_to_alls, mean over ranks\n",
                o.steps, o.warmup);
    std::printf("# dense: h -> k*f -> h MLP on the same tokens (the MoE layer's active FLOPs, no routing or exchange)\n");
    if (probe) std::printf("# %s\n", bench::describe(*probe).c_str());
    std::printf("%-3s %-9s %-9s %12s %9s %8s %6s %7s %9s %9s\n", "ep", "router", "capacity", "tokens/s", "step ms",
                "a2a ms", "a2a %", "drop %", "imbalance", "vs dense");
    auto print_row = [&](const Row& r) {
      const bool is_dense = r.router == "dense";
      char vs[32] = "-";
      if (dense && dense->step_ms > 0) std::snprintf(vs, sizeof vs, "%.2f", r.step_ms / dense->step_ms);
      char imb[32] = "-";
      if (!is_dense) std::snprintf(imb, sizeof imb, "%.2f", r.imbalance);
      std::printf("%-3d %-9s %-9s %12.0f %9.2f %8.2f %6.1f %7.2f %9s %9s\n", r.ep, r.router.c_str(),
                  capacity_label(r.capacity_factor).c_str(), r.tokens_per_s, r.step_ms, r.a2a_ms,
                  100.0 * r.a2a_share, 100.0 * r.drop_rate, imb, vs);
    };
    if (dense) print_row(*dense);
    for (const auto& r : rows) print_row(r);
    if (have_goal) {
      std::printf("# goal: dropless / capacity 1.25 step time, balanced router, ep=%d: %.3fx (goal <= %.2fx): %s\n", ep,
                  goal_ratio, o.goal, goal_pass ? "PASS" : "FAIL");
    } else {
      std::printf("# goal: n/a (needs the balanced router at capacity 1.25 and dropless)\n");
    }
    std::printf("# verified: %s\n", verified ? "outputs finite, assignments and drops as the capacity rule says"
                                             : "CHECK FAILED (see stderr)");
    std::fflush(stdout);
  }

  if (leader && !o.json.empty()) {
    auto row_json = [&](const Row& r) {
      nlohmann::json j = {{"ranks", r.ranks},
                          {"ep", r.ep},
                          {"router", r.router},
                          {"capacity", capacity_label(r.capacity_factor)},
                          {"capacity_factor", r.capacity_factor < 0 ? nlohmann::json(nullptr)
                                                                    : nlohmann::json(r.capacity_factor)},
                          {"dropless", r.capacity_factor == 0},
                          {"capacity_tokens", r.capacity},
                          {"global_tokens", tokens_per_rank * N},
                          {"tokens_per_s", r.tokens_per_s},
                          {"step_ms", r.step_ms},
                          {"steps_ms", r.steps_ms},
                          {"a2a_ms", r.a2a_ms},
                          {"a2a_share", r.a2a_share},
                          {"drop_rate", r.drop_rate},
                          {"dropped", r.dropped},
                          {"assignments", r.assignments},
                          {"imbalance", r.router == "dense" ? nlohmann::json(nullptr) : nlohmann::json(r.imbalance)},
                          {"aux_loss", r.aux_loss},
                          {"tokens_per_expert", r.tokens_per_expert}};
      j["vs_dense"] = dense && dense->step_ms > 0 ? nlohmann::json(r.step_ms / dense->step_ms) : nlohmann::json(nullptr);
      return j;
    };
    nlohmann::json jrows = nlohmann::json::array();
    if (dense) jrows.push_back(row_json(*dense));
    for (const auto& r : rows) jrows.push_back(row_json(r));
    nlohmann::json jprobe = nullptr;
    if (probe) jprobe = {{"probe", "memcpy"}, {"bytes", probe->bytes}, {"runs", probe->runs}, {"gbps", probe->gbps}};
    nlohmann::json jgoal = {{"what", "dropless step time / capacity 1.25 step time, balanced router"},
                            {"limit", o.goal},
                            {"ratio", have_goal ? nlohmann::json(goal_ratio) : nlohmann::json(nullptr)},
                            {"pass", have_goal ? nlohmann::json(goal_pass) : nlohmann::json(nullptr)}};
    nlohmann::json out = {{"program", "torus-bench-moe"},
                          {"command", command},
                          {"commit", o.commit},
                          {"date", utc_now()},
                          {"ranks", N},
                          {"ep", ep},
                          {"dp", dp},
                          {"config",
                           {{"experts", o.experts},
                            {"top_k", o.top_k},
                            {"hidden", o.hidden},
                            {"ffn_hidden", o.ffn},
                            {"seq", o.seq},
                            {"batch", o.batch},
                            {"tokens_per_rank", tokens_per_rank},
                            {"aux_loss_weight", 0.01},
                            {"skew", o.skew},
                            {"steps", o.steps},
                            {"warmup", o.warmup},
                            {"threads", o.threads},
                            {"dtype", "f32"}}},
                          {"probe", jprobe},
                          {"rows", jrows},
                          {"goal", jgoal},
                          {"verified", verified}};
    std::ofstream f(o.json);
    if (!f) {
      std::fprintf(stderr, "torus-bench-moe: cannot write %s\n", o.json.c_str());
      return 1;
    }
    f << out.dump(1) << "\n";
  }
  if (!verified) {
    if (leader) std::fprintf(stderr, "torus-bench-moe: verification failed\n");
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string command = command_line(argc, argv);
  torus::retain_freed_host_memory();  // step times without the page faults of fresh mappings
  at::set_num_threads(o.threads);

  comm::ProcessGroupPtr world;
  try {
    // The probe runs before the bootstrap, on rank 0 alone, while no other
    // rank computes or communicates.
    std::optional<bench::MemcpyProbe> probe;
    if (o.probe && comm::detect_launch(comm::InitOptions{}).rank == 0) probe = bench::memcpy_probe();
    world = torus::init();
    return run(world, o, probe, command);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-bench-moe%s: %s\n",
                 world ? (" (rank " + std::to_string(world->rank()) + ")").c_str() : "", e.what());
    // Leave no peer waiting on this rank until its deadline.
    if (world) world->abort(e.what());
    return 1;
  }
}
