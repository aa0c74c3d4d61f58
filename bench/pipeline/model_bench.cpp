// bench/pipeline/model_bench.cpp — torus-bench-pipeline-model: the pipeline
// schedules on the real model. Where torus-bench-pipeline (main.cpp)
// emulates each stage's compute, this one trains the byte-level GPT with
// GPTTrainer (tp = dp = 1, pp = the world) under GPipe, 1F1B, interleaved
// 1F1B and ZB-H1 and reports, per (schedule, m): step time, tokens/s, the
// measured bubble against its theory, the peak of live micro-batches per
// stage and the peak activation memory per stage.
//
//   mpirun -np 4 build/bench/torus-bench-pipeline-model --micro 4,8,16 --json p4.json
//
// Every configuration is its own GPTTrainer, built from the same seed, and
// trains on the same batches (batch k of a sampler per m, m x --micro-rows
// sequences of --seq bytes: the micro-batch size is fixed, the global batch
// grows with m). Configurations run in rounds — one step of each per round,
// --warmup untimed rounds then --repeats timed ones — so that a burst of load
// on the machine spreads over many configurations. Per timed step and rank:
// the trainer's step time, the executor's StepResult (busy, wall, origin,
// peak live, the action trace) and the memory log below.
//
//  * step_ms: the slowest rank's train_step (pipeline, gradient sync,
//    clipping, AdamW), median over the timed steps; tokens/s = tokens of the
//    global batch / step_ms. The other columns come from that median step.
//  * cpu: the process's CPU time (all threads) during train_step / its wall
//    time, mean over ranks: the share of a core a rank got. Bubbles lower
//    it, and so do more ranks than cores: then ranks queue for a core and the
//    measured bubble includes that wait (p = 4 on 2 cores cannot go below
//    1/2).
//  * bubble: as in main.cpp, the pipeline's makespan runs from rank 0's
//    start of PipelineExecutor::run() to the last rank's end (one host: the
//    ranks share the steady clock); a rank's bubble is 1 - busy / makespan,
//    the step's is the mean over ranks.
//  * theory: simulate() of the schedule with a CostModel from the step's
//    mean measured action times (t_F = mean forward x v; fused schedules:
//    t_B = mean backward, t_W = 0; ZB-H1: t_B, t_W = mean input- and
//    weight-gradient times, x v), i.e. uniform stages, no message time;
//    replay: simulate() with the duration each action really took in that
//    step (stages as unequal as they really are), no message time; closed:
//    the closed form with the same costs.
//
// Note [Activation memory]: the CPU allocator of LibTorch keeps no
// statistics, so this program installs, before anything is allocated, a
// counting allocator in front of it (c10::SetCPUAllocator): every CPU tensor
// allocation adds its bytes to a live counter and its free subtracts them,
// on any thread; during timed steps each change is logged with a steady-
// clock time stamp. From the log and the executor's trace, per rank:
//  * act/mb: bytes one forward action leaves allocated — live bytes at the
//    forward's end minus at its start: what autograd saved for the backward
//    plus the chunk's output (mean over the step's forwards; the received
//    input, one activation message, is allocated before the forward and
//    not included);
//  * act_peak = act/mb x the executor's peak of live micro-batches (of
//    (micro, chunk) pairs, for the interleaved schedule): the peak
//    activation memory the schedule implies if a live micro-batch holds all
//    its forward saved until its (weight) backward. With a split backward
//    (ZB-H1) the input-gradient pass may free part of it early, so there
//    act_peak is an upper bound and mem_peak the measurement;
//  * mem_peak: the peak of live bytes during PipelineExecutor::run() minus
//    the live bytes at its start (parameters, gradients and optimizer state
//    are resident before it): everything the schedule allocates at once —
//    saved activations, received inputs, gradients in flight and the
//    temporaries of the running op. A direct measurement, act_peak's upper
//    check.
//
// Checks: every loss finite; each schedule's losses equal, step by step, to
// those of the first schedule at the same m within --loss-tol (they train the
// same model on the same data; only the order of gradient accumulation
// differs); the executor's peak live micro-batches equal to the simulated
// ones; every CPU allocation counted.
// Exit status: 0 if every check passed, 2 if some check failed, 1 on error.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/options.h"
#include "torus/comm/process_group.h"
#include "torus/core/error.h"
#include "torus/parallel/pipeline/executor.h"
#include "torus/run/corpus.h"
#include "torus/engine/gpt_model.h"

namespace torus::bench {
namespace {

using pp::ScheduleKind;
using Clock = std::chrono::steady_clock;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// CPU time (user + system, every thread) this process has used, in seconds.
double cpu_seconds() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// ---- the counting allocator (Note [Activation memory]) -------------------------

class MemoryMeter final : public c10::Allocator {
 public:
  struct Event {
    double t;      // steady clock, seconds since its epoch
    int64_t live;  // live bytes after the change
  };

  // Installs the meter in front of the current CPU allocator; once, before
  // any tensor that should be counted. Never destroyed: tensors may be freed
  // during static destruction.
  static MemoryMeter& install() {
    static MemoryMeter* meter = new MemoryMeter(c10::GetCPUAllocator());
    c10::SetCPUAllocator(meter, /*priority=*/100);
    return *meter;
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr d = inner_->allocate(n);
    if (d.get() == nullptr) return d;
    // The default CPU allocator returns "simple" pointers (data == context,
    // deleter == raw_deleter()); anything else passes through uncounted.
    if (d.get() != d.get_context() || inner_deleter_ == nullptr || d.get_deleter() != inner_deleter_) {
      uncounted_.fetch_add(1);
      return d;
    }
    const c10::Device device = d.device();
    void* p = d.release_context();
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = n;
    change(static_cast<int64_t>(n));
    return {p, p, &MemoryMeter::release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &MemoryMeter::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  int64_t live() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }
  int64_t uncounted() const { return uncounted_.load(); }

  // Time-stamped log of every change, from start_log() to take_log().
  void start_log() {
    std::lock_guard<std::mutex> lock(mu_);
    log_.clear();
    logging_ = true;
    log_.push_back({now_s(), live_});
  }
  std::vector<Event> take_log() {
    std::lock_guard<std::mutex> lock(mu_);
    logging_ = false;
    log_.push_back({now_s(), live_});
    return std::move(log_);
  }

 private:
  explicit MemoryMeter(c10::Allocator* inner) : inner_(inner), inner_deleter_(inner->raw_deleter()) {
    self_ = this;
  }
  static void release(void* p) {
    MemoryMeter& m = *self_;
    {
      std::lock_guard<std::mutex> lock(m.mu_);
      auto it = m.sizes_.find(p);
      if (it != m.sizes_.end()) {
        m.change(-static_cast<int64_t>(it->second));
        m.sizes_.erase(it);
      }
    }
    m.inner_deleter_(p);
  }
  void change(int64_t bytes) {  // under mu_
    live_ += bytes;
    if (logging_) log_.push_back({now_s(), live_});
  }

  static inline MemoryMeter* self_ = nullptr;
  c10::Allocator* inner_;
  c10::DeleterFnPtr inner_deleter_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  int64_t live_ = 0;
  bool logging_ = false;
  std::vector<Event> log_;
  std::atomic<int64_t> uncounted_{0};
};

// Live bytes at time t: the value after the last change at or before t.
int64_t live_at(const std::vector<MemoryMeter::Event>& log, double t) {
  auto it = std::upper_bound(log.begin(), log.end(), t,
                             [](double x, const MemoryMeter::Event& e) { return x < e.t; });
  return it == log.begin() ? log.front().live : std::prev(it)->live;
}

// ---- options --------------------------------------------------------------------

struct Options {
  std::vector<ScheduleKind> schedules{std::begin(pp::kAllScheduleKinds), std::end(pp::kAllScheduleKinds)};
  std::vector<int> micro{4, 8, 16};
  int chunks = 2;
  int64_t layers = 8, hidden = 128, heads = 4, seq = 64;
  int64_t micro_rows = 1;  // sequences per micro-batch
  double lr = 1e-3;
  int64_t seed = 1234;
  std::string data;
  int threads = 0;
  int warmup = 2;
  int repeats = 5;
  double loss_tol = 1e-5;
  std::string json;
  bool verbose = false;
  bool help = false;
};

void print_help() {
  std::printf(
      "torus-bench-pipeline-model — pipeline schedules on the real model: step time, tokens/s,\n"
      "measured vs theoretical bubble, peak live micro-batches and activation memory per stage.\n\n"
      "Usage: mpirun -np P torus-bench-pipeline-model [options]     (P = pipeline ranks; tp = dp = 1)\n"
      "   eg: mpirun -np 4 torus-bench-pipeline-model --micro 4,8,16 --json p4.json\n\n"
      "Options:\n"
      "      --schedules LIST   gpipe,1f1b,interleaved,zb-h1 (default: all)\n"
      "      --micro LIST       micro-batches per step (default 4,8,16); interleaved skips m not a multiple of P\n"
      "      --chunks V         chunks per rank of the interleaved schedule (default 2)\n"
      "      --layers N         transformer blocks (default 8)\n"
      "      --hidden N         model width (default 128)\n"
      "      --heads N          attention heads (default 4)\n"
      "      --seq N            sequence length in bytes (default 64)\n"
      "      --micro-rows N     sequences per micro-batch (default 1); the global batch is m x N\n"
      "      --lr X             AdamW learning rate, constant (default 1e-3)\n"
      "      --seed N           initialisation and data order (default 1234)\n"
      "      --data PATH        text file or directory (default: the licence texts every Debian system ships)\n"
      "      --threads N        intra-op threads per rank (0: cores / local ranks, at least 1)\n"
      "  -w, --warmup N         untimed steps per configuration, >= 1: gradients and AdamW state exist before\n"
      "                         the timed steps, so mem_peak does not count them (default 2)\n"
      "  -n, --repeats N        timed steps per configuration; the median step is reported (default 5)\n"
      "      --loss-tol X       max |loss difference| between schedules at the same m (default 1e-5)\n"
      "      --json FILE        write the records as JSON (rank 0)\n"
      "  -v, --verbose          print every timed step\n"
      "  -h, --help             this text\n\n"
      "Columns: step_ms = slowest rank's train_step, median of the timed steps; tok/s = global batch\n"
      "tokens / step_ms; cpu = the process's CPU time / step time, mean over ranks (what the rank got\n"
      "of a core: bubbles and, with more ranks than cores, waiting for a core lower it);\n"
      "bubble = 1 - busy / pipeline makespan, mean over ranks; theory = simulate() with\n"
      "the step's mean action times; replay = simulate() with every action's real duration; closed = the\n"
      "closed form; err, err/rep = bubble relative to theory and replay; live = peak live micro-batches\n"
      "per stage (executor); act/mb = bytes one forward leaves allocated (saved activations + output),\n"
      "per stage; act_peak = act/mb x live; mem_peak = peak bytes allocated during the pipeline above its\n"
      "start (counting CPU allocator); dloss = max |loss - loss of the first schedule| over all steps.\n");
}

Options parse(int argc, char** argv) {
  Cli cli;
  Options o;
  cli.flag("-h,--help", [&] { o.help = true; });
  cli.option("--schedules", [&](const std::string& v) {
    o.schedules.clear();
    for (const auto& n : split_list(v)) o.schedules.push_back(pp::schedule_kind_from_name(n));
  });
  cli.option("--micro", [&](const std::string& v) {
    o.micro.clear();
    for (const auto& n : split_list(v)) o.micro.push_back(static_cast<int>(parse_int(n, "--micro", 1)));
  });
  cli.option("--chunks", [&](const std::string& v) { o.chunks = static_cast<int>(parse_int(v, "--chunks", 1)); });
  cli.option("--layers", [&](const std::string& v) { o.layers = parse_int(v, "--layers", 1); });
  cli.option("--hidden", [&](const std::string& v) { o.hidden = parse_int(v, "--hidden", 1); });
  cli.option("--heads", [&](const std::string& v) { o.heads = parse_int(v, "--heads", 1); });
  cli.option("--seq", [&](const std::string& v) { o.seq = parse_int(v, "--seq", 1); });
  cli.option("--micro-rows", [&](const std::string& v) { o.micro_rows = parse_int(v, "--micro-rows", 1); });
  cli.option("--lr", [&](const std::string& v) { o.lr = parse_nonnegative(v, "--lr"); });
  cli.option("--seed", [&](const std::string& v) { o.seed = parse_int(v, "--seed", 0); });
  cli.option("--data", [&](const std::string& v) { o.data = v; });
  cli.option("--threads", [&](const std::string& v) { o.threads = static_cast<int>(parse_int(v, "--threads", 0)); });
  cli.option("-w,--warmup", [&](const std::string& v) { o.warmup = static_cast<int>(parse_int(v, "--warmup", 1)); });
  cli.option("-n,--repeats", [&](const std::string& v) { o.repeats = static_cast<int>(parse_int(v, "--repeats", 1)); });
  cli.option("--loss-tol", [&](const std::string& v) { o.loss_tol = parse_nonnegative(v, "--loss-tol"); });
  cli.option("--json", [&](const std::string& v) { o.json = v; });
  cli.flag("-v,--verbose", [&] { o.verbose = true; });
  cli.parse(argc, argv);
  return o;
}

// ---- one configuration ------------------------------------------------------------

struct Record {
  std::string schedule;
  int p = 0, m = 0, v = 1;
  int64_t tokens = 0;
  double step_ms = 0, tokens_per_s = 0;
  std::vector<double> step_ms_all;
  double bubble = 0, theory = 0, replay = 0, closed = 0;
  double t_forward = 0, t_backward = 0, t_weight = 0;  // ms, per micro-batch and rank (CostModel)
  std::vector<double> bubble_per_rank;
  std::vector<int> peak_live, peak_live_sim;
  std::vector<double> act_per_micro, act_peak, mem_peak;  // bytes, per rank
  std::vector<double> cpu_share;                          // CPU seconds / step seconds, per rank
  double cpu_mean() const {
    double sum = 0;
    for (double c : cpu_share) sum += c;
    return cpu_share.empty() ? 0 : sum / static_cast<double>(cpu_share.size());
  }
  std::vector<double> losses;
  double loss_diff = 0;
  bool live_ok = true, finite = true;
  double rel_err() const { return theory > 0 ? (bubble - theory) / theory : 0.0; }
  double rel_err_replay() const { return replay > 0 ? (bubble - replay) / replay : 0.0; }
};

at::Tensor to_tensor(const std::vector<int64_t>& tokens, int64_t rows, int64_t cols) {
  return at::from_blob(const_cast<int64_t*>(tokens.data()), {rows, cols}, at::TensorOptions().dtype(at::kLong))
      .clone();
}

class Case {
 public:
  Case(const comm::ProcessGroupPtr& world, ScheduleKind kind, int m, const models::GPTConfig& model,
       const run::BatchSampler& data, MemoryMeter& meter, const Options& o)
      : world_(world), kind_(kind), m_(m), data_(data), meter_(meter), o_(o) {
    engine::ParallelLayout layout;
    layout.pp = world->size();
    layout.schedule = kind;
    layout.num_micro = m;
    layout.num_chunks = kind == ScheduleKind::kInterleaved1F1B ? o.chunks : 1;
    engine::OptimizerConfig optim;
    optim.lr = o.lr;
    engine::TrainerOptions topts;
    topts.record_trace = true;
    trainer_ = std::make_unique<engine::GPTTrainer>(world, model, layout, optim, topts);
    const pp::Schedule& s = trainer_->schedule();
    sim_ = pp::simulate(s);
    for (const auto& list : s.actions) longest_ = std::max(longest_, static_cast<int64_t>(list.size()));
    mine_ = at::zeros({o.repeats, kHead + longest_}, at::kDouble);
  }

  // One training step on batch `step`; `timed` >= 0 stores its measurements.
  void step(int step, int timed) {
    at::Tensor batch = to_tensor(data_.batch(step), data_.batch_size(), o_.seq + 1);
    world_->barrier()->wait();
    if (timed >= 0) meter_.start_log();
    const double cpu0 = cpu_seconds();
    engine::StepStats st = trainer_->train_step(batch);
    const double cpu = cpu_seconds() - cpu0;
    std::vector<MemoryMeter::Event> log;
    if (timed >= 0) log = meter_.take_log();
    losses_.push_back(st.loss);
    tokens_ = st.tokens;
    if (timed < 0) return;
    const pp::StepResult& r = trainer_->last_pipeline_result();
    auto x = mine_.accessor<double, 2>()[timed];
    x[0] = r.busy;
    x[1] = r.wall;
    x[2] = r.origin;
    x[3] = r.peak_live;
    x[4] = st.seconds;
    // Note [Activation memory].
    const int64_t base = live_at(log, r.origin);
    int64_t peak = base;
    for (const auto& e : log) {
      if (e.t >= r.origin && e.t <= r.origin + r.wall) peak = std::max(peak, e.live);
    }
    double fwd_bytes = 0;
    int fwd = 0;
    for (size_t i = 0; i < r.trace.size(); ++i) {
      const pp::ActionRecord& a = r.trace[i];
      x[kHead + i] = (a.end - a.start) * 1e3;
      if (a.action.kind != pp::ActionKind::kForward) continue;
      fwd_bytes += static_cast<double>(live_at(log, r.origin + a.end) - live_at(log, r.origin + a.start));
      ++fwd;
    }
    x[5] = static_cast<double>(peak - base);
    x[6] = fwd > 0 ? fwd_bytes / fwd : 0;
    x[7] = cpu / st.seconds;
    if (o_.verbose) {
      std::printf("#   rank %d %s m=%d timed step %d: %.1f ms, pipeline %.1f ms, busy %.1f ms, mem_peak %.2f MiB, "
                  "act/mb %.2f MiB, loss %.6f, %zu memory events\n",
                  world_->rank(), trainer_->schedule().name.c_str(), m_, timed, st.seconds * 1e3, r.wall * 1e3,
                  r.busy * 1e3, x[5] / (1 << 20), x[6] / (1 << 20), st.loss, log.size());
      std::fflush(stdout);
    }
  }

  // Collective: gathers every rank's measurements; meaningful on rank 0.
  Record record() {
    const int p = world_->size();
    const bool one_host = world_->context()->hosts().num_hosts() == 1;
    const pp::Schedule& s = trainer_->schedule();
    at::Tensor all = at::zeros({p, o_.repeats, kHead + longest_}, at::kDouble);
    world_->all_gather(mine_, all)->wait();
    auto a = all.accessor<double, 3>();

    Record rec;
    rec.schedule = std::string(pp::schedule_kind_name(kind_));
    rec.p = p;
    rec.m = m_;
    rec.v = s.num_chunks;
    rec.tokens = tokens_;
    rec.losses = losses_;
    for (double l : losses_) rec.finite = rec.finite && std::isfinite(l);
    // The median step by step time (the slowest rank's).
    std::vector<std::pair<double, int>> steps;
    for (int it = 0; it < o_.repeats; ++it) {
      double t = 0;
      for (int r = 0; r < p; ++r) t = std::max(t, a[r][it][4]);
      steps.push_back({t, it});
      rec.step_ms_all.push_back(t * 1e3);
    }
    std::sort(steps.begin(), steps.end());
    const int it = steps[steps.size() / 2].second;
    rec.step_ms = steps[steps.size() / 2].first * 1e3;
    rec.tokens_per_s = static_cast<double>(tokens_) / (rec.step_ms / 1e3);

    double makespan = 0;
    for (int r = 0; r < p; ++r) {
      makespan = std::max(makespan, one_host ? a[r][it][2] + a[r][it][1] - a[0][it][2] : a[r][it][1]);
    }
    std::vector<std::vector<double>> durations(p);
    // Mean action times (ms) per kind, over every rank: the CostModel.
    std::map<pp::ActionKind, std::pair<double, int>> mean;
    for (int r = 0; r < p; ++r) {
      rec.bubble_per_rank.push_back(1.0 - a[r][it][0] / makespan);
      rec.bubble += rec.bubble_per_rank.back() / p;
      for (size_t i = 0; i < s.actions[r].size(); ++i) {
        const double ms = a[r][it][kHead + i];
        durations[r].push_back(ms);
        const pp::ActionKind k = s.actions[r][i].kind;
        if (pp::is_compute(k)) {
          mean[k].first += ms;
          mean[k].second += 1;
        }
      }
      rec.peak_live.push_back(static_cast<int>(a[r][it][3]));
      rec.peak_live_sim.push_back(sim_.ranks[r].peak_live);
      rec.live_ok = rec.live_ok && rec.peak_live.back() == rec.peak_live_sim.back();
      rec.mem_peak.push_back(a[r][it][5]);
      rec.act_per_micro.push_back(a[r][it][6]);
      rec.act_peak.push_back(a[r][it][6] * a[r][it][3]);
      rec.cpu_share.push_back(a[r][it][7]);
    }
    auto avg = [&](pp::ActionKind k) {
      auto f = mean.find(k);
      return f == mean.end() || f->second.second == 0 ? 0.0 : f->second.first / f->second.second;
    };
    rec.t_forward = avg(pp::ActionKind::kForward) * rec.v;
    if (kind_ == ScheduleKind::kZeroBubbleH1) {
      rec.t_backward = avg(pp::ActionKind::kBackwardInput) * rec.v;
      rec.t_weight = avg(pp::ActionKind::kBackwardWeight) * rec.v;
    } else {
      rec.t_backward = avg(pp::ActionKind::kBackward) * rec.v;
      rec.t_weight = 0;
    }
    const pp::CostModel costs{rec.t_forward, rec.t_backward, rec.t_weight, 0};
    rec.theory = pp::simulate(s, costs).bubble();
    rec.replay = pp::simulate(s, durations, 0).bubble();
    // The ZB-H1 form holds for m >= p and t_W <= min(t_F, t_B) only; with
    // the measured times outside that range there is none to show (NaN).
    const bool closed_valid = kind_ != ScheduleKind::kZeroBubbleH1 ||
                              (m_ >= p && rec.t_weight <= std::min(rec.t_forward, rec.t_backward));
    rec.closed = closed_valid ? pp::closed_form_bubble(kind_, p, m_, rec.v, costs) : std::nan("");
    return rec;
  }

  ScheduleKind kind() const { return kind_; }
  int m() const { return m_; }

 private:
  // busy, wall, origin, peak live, step seconds, mem_peak, act/mb, CPU share; then action durations (ms)
  static constexpr int kHead = 8;
  comm::ProcessGroupPtr world_;
  ScheduleKind kind_;
  int m_;
  const run::BatchSampler& data_;
  MemoryMeter& meter_;
  const Options& o_;
  std::unique_ptr<engine::GPTTrainer> trainer_;
  pp::Simulation sim_;
  int64_t longest_ = 0;
  at::Tensor mine_;
  std::vector<double> losses_;
  int64_t tokens_ = 0;
};

// ---- output -----------------------------------------------------------------------

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::string join_mib(const std::vector<double>& v, int digits = 1) {
  std::string s;
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.*f", i ? "," : "", digits, v[i] / (1 << 20));
    s += buf;
  }
  return s;
}

std::string join_num(const std::vector<double>& v, const char* fmt) {
  std::string s;
  char buf[48];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, fmt, v[i]);
    s += (i ? ", " : "") + std::string(buf);
  }
  return s;
}

void print_header() {
  std::printf("%-12s %2s %3s %2s %8s %8s %5s %7s %7s %7s %7s %7s %7s  %-12s %-19s %-19s %-19s %8s\n", "schedule", "p",
              "m", "v", "step_ms", "tok/s", "cpu", "bubble", "theory", "replay", "closed", "err", "err/rep", "live",
              "act/mb MiB", "act_peak MiB", "mem_peak MiB", "dloss");
}

void print_row(const Record& r) {
  char closed[16] = "-";
  if (std::isfinite(r.closed)) std::snprintf(closed, sizeof closed, "%.4f", r.closed);
  std::printf("%-12s %2d %3d %2d %8.1f %8.0f %5.2f %7.4f %7.4f %7.4f %7s %+6.1f%% %+6.1f%%  %-12s %-19s %-19s %-19s %8.1e\n",
              r.schedule.c_str(), r.p, r.m, r.v, r.step_ms, r.tokens_per_s, r.cpu_mean(), r.bubble, r.theory, r.replay, closed,
              100 * r.rel_err(), 100 * r.rel_err_replay(), join(r.peak_live).c_str(),
              join_mib(r.act_per_micro, 2).c_str(), join_mib(r.act_peak).c_str(), join_mib(r.mem_peak).c_str(),
              r.loss_diff);
  std::fflush(stdout);
}

constexpr const char* kMemoryMethod =
    "counting CPU allocator in front of LibTorch's (c10::SetCPUAllocator), every allocation and free logged with a "
    "steady-clock time stamp; act_per_micro = live bytes at the end minus at the start of each forward action "
    "(saved activations + the chunk output; received input not included), mean over the step's forwards; "
    "act_peak = act_per_micro x executor peak_live; mem_peak = max live bytes during PipelineExecutor::run() minus "
    "live bytes at its start";

std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", x);
  return buf;
}

bool write_json(const std::string& path, const std::vector<Record>& records, const Options& o, int threads,
                const std::string& backend) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "torus-bench-pipeline-model: cannot write %s\n", path.c_str());
    return false;
  }
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    std::fprintf(
        f,
        "  {\"schedule\": \"%s\", \"p\": %d, \"m\": %d, \"v\": %d, \"layers\": %lld, \"hidden\": %lld, "
        "\"heads\": %lld, \"seq\": %lld, \"micro_rows\": %lld, \"tokens_per_step\": %lld, \"threads\": %d, "
        "\"warmup\": %d, \"repeats\": %d, \"step_ms\": %.3f, \"step_ms_all\": [%s], \"tokens_per_s\": %.1f, "
        "\"bubble\": %.6f, \"bubble_theory\": %.6f, \"bubble_replay\": %.6f, \"bubble_closed_form\": %s, "
        "\"rel_err\": %.6f, \"rel_err_replay\": %.6f, \"t_forward_ms\": %.4f, \"t_backward_ms\": %.4f, "
        "\"t_weight_ms\": %.4f, \"bubble_per_rank\": [%s], \"peak_live\": [%s], \"peak_live_theory\": [%s], "
        "\"act_bytes_per_micro\": [%s], \"act_peak_bytes\": [%s], \"mem_peak_bytes\": [%s], "
        "\"cpu_share_per_rank\": [%s], \"backend\": \"%s\", "
        "\"losses\": [%s], \"loss_max_diff\": %.3e, \"memory_method\": \"%s\"}%s\n",
        r.schedule.c_str(), r.p, r.m, r.v, static_cast<long long>(o.layers), static_cast<long long>(o.hidden),
        static_cast<long long>(o.heads), static_cast<long long>(o.seq), static_cast<long long>(o.micro_rows),
        static_cast<long long>(r.tokens), threads, o.warmup, o.repeats, r.step_ms,
        join_num(r.step_ms_all, "%.3f").c_str(), r.tokens_per_s, r.bubble, r.theory, r.replay, json_number(r.closed).c_str(), r.rel_err(),
        r.rel_err_replay(), r.t_forward, r.t_backward, r.t_weight, join_num(r.bubble_per_rank, "%.6f").c_str(),
        join(r.peak_live).c_str(), join(r.peak_live_sim).c_str(), join_num(r.act_per_micro, "%.0f").c_str(),
        join_num(r.act_peak, "%.0f").c_str(), join_num(r.mem_peak, "%.0f").c_str(),
        join_num(r.cpu_share, "%.4f").c_str(), backend.c_str(),
        join_num(r.losses, "%.8f").c_str(), r.loss_diff, kMemoryMethod, i + 1 < records.size() ? "," : "");
  }
  std::fprintf(f, "]\n");
  return std::fclose(f) == 0;
}

int run(const Options& o, MemoryMeter& meter) {
  const std::string data_path = o.data.empty() ? run::default_corpus_path() : o.data;
  const run::Corpus corpus = run::Corpus::load(data_path);
  auto world = torus::init();
  const int p = world->size();
  const bool root = world->rank() == 0;
  const int local = std::max(1, world->context()->launch().local_size);
  const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  const int threads = o.threads > 0 ? o.threads : std::max(1, cores / local);
  at::set_num_threads(threads);
  const std::string backend(world->context()->host_backend_name());

  models::GPTConfig model;
  model.vocab_size = 256;
  model.max_seq_len = o.seq;
  model.num_layers = o.layers;
  model.hidden = o.hidden;
  model.num_heads = o.heads;
  model.seed = static_cast<uint64_t>(o.seed);

  // One sampler per m: every schedule at that m sees the same batches.
  std::map<int, std::unique_ptr<run::BatchSampler>> samplers;
  for (int m : o.micro) {
    if (!samplers.count(m)) {
      samplers[m] = std::make_unique<run::BatchSampler>(corpus.bytes(), o.seq, m * o.micro_rows,
                                                          static_cast<uint64_t>(o.seed), "corpus");
    }
  }
  std::vector<std::unique_ptr<Case>> cases;
  for (ScheduleKind kind : o.schedules) {
    for (int m : o.micro) {
      const int v = kind == ScheduleKind::kInterleaved1F1B ? o.chunks : 1;
      if (v > 1 && (m % p != 0 || p < 2)) {
        if (root)
          std::printf("# %s: skipping m=%d (needs p >= 2 and m a multiple of p=%d)\n",
                      std::string(pp::schedule_kind_name(kind)).c_str(), m, p);
        continue;
      }
      cases.push_back(std::make_unique<Case>(world, kind, m, model, *samplers[m], meter, o));
    }
  }
  if (root) {
    std::printf(
        "# torus-bench-pipeline-model: p=%d ranks (tp=1 dp=1), GPT %lld layers, width %lld, %lld heads, seq %lld, "
        "vocab 256; micro-batch %lld x %lld tokens; interleaved v=%d; %d thread(s) per rank, %d cores; %s backend; "
        "%d warm-up + %d timed steps (median)\n",
        p, static_cast<long long>(o.layers), static_cast<long long>(o.hidden), static_cast<long long>(o.heads),
        static_cast<long long>(o.seq), static_cast<long long>(o.micro_rows), static_cast<long long>(o.seq), o.chunks,
        threads, cores, backend.c_str(), o.warmup, o.repeats);
    std::printf("# data: %s (%zu bytes)\n", corpus.source().c_str(), corpus.size());
    std::printf("# memory: %s\n", kMemoryMethod);
    std::fflush(stdout);
  }
  for (int round = 0; round < o.warmup + o.repeats; ++round) {
    for (auto& c : cases) c->step(round, round - o.warmup);
  }
  std::vector<Record> records;
  for (auto& c : cases) records.push_back(c->record());
  // Losses: every schedule against the first one at the same m.
  std::map<int, const Record*> first;
  for (auto& r : records) {
    if (!first.count(r.m)) first[r.m] = &r;
    const Record& ref = *first[r.m];
    for (size_t i = 0; i < r.losses.size() && i < ref.losses.size(); ++i) {
      r.loss_diff = std::max(r.loss_diff, std::abs(r.losses[i] - ref.losses[i]));
    }
  }
  // Allocations that bypassed the meter: non-simple pointers of the inner
  // allocator, or all of them if something replaced the meter.
  const bool installed = c10::GetCPUAllocator() == &meter;
  at::Tensor uncounted =
      at::full({1}, installed ? static_cast<double>(meter.uncounted()) : 1e18, at::kDouble);
  world->all_reduce(uncounted)->wait();
  bool ok = uncounted.item<double>() == 0;
  if (root) {
    print_header();
    for (const auto& r : records) print_row(r);
    for (const auto& r : records) {
      if (!r.live_ok) {
        std::printf("# FAILED: %s m=%d: peak live %s, simulated %s\n", r.schedule.c_str(), r.m,
                    join(r.peak_live).c_str(), join(r.peak_live_sim).c_str());
      }
      if (!r.finite) std::printf("# FAILED: %s m=%d: a loss is not finite\n", r.schedule.c_str(), r.m);
      if (!(r.loss_diff <= o.loss_tol)) {
        std::printf("# FAILED: %s m=%d: losses differ from %s's by %.2e > %.1e\n", r.schedule.c_str(), r.m,
                    first[r.m]->schedule.c_str(), r.loss_diff, o.loss_tol);
      }
    }
    if (!ok) {
      std::printf("# FAILED: CPU allocations were not counted (%s)\n",
                  uncounted.item<double>() >= 1e18 ? "the counting allocator was replaced" : "non-simple pointers");
    }
  }
  for (const auto& r : records) ok = ok && r.live_ok && r.finite && r.loss_diff <= o.loss_tol;
  if (root) {
    std::printf("# checks: %s\n", ok ? "losses equal across schedules, finite; peak live as simulated; every "
                                       "allocation counted"
                                     : "FAILED");
    if (!o.json.empty() && !write_json(o.json, records, o, threads, backend)) return 1;
  }
  world->barrier()->wait();
  return ok ? 0 : 2;
}

}  // namespace
}  // namespace torus::bench

int main(int argc, char** argv) {
  // First: every CPU tensor from here on is counted.
  torus::bench::MemoryMeter& meter = torus::bench::MemoryMeter::install();
  torus::bench::Options o;
  try {
    o = torus::bench::parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-bench-pipeline-model: %s\n", e.what());
    return 1;
  }
  if (o.help) {
    torus::bench::print_help();
    return 0;
  }
  try {
    return torus::bench::run(o, meter);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-bench-pipeline-model: error: %s\n", e.what());
    return 1;
  }
}
