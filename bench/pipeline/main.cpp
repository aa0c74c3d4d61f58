// bench/pipeline/main.cpp — torus-bench-pipeline: the pipeline schedule
// benchmark. Runs GPipe, 1F1B, interleaved 1F1B and ZB-H1 on the real
// executor (PipelineExecutor over the world ProcessGroup), with the compute of
// every stage emulated by fixed-duration work (sleep by default, so that many
// ranks fit on few cores), and compares each schedule's measured bubble with
// its theory (simulate() with the same costs, and the closed form).
//
//   mpirun -np 4 build/bench/torus-bench-pipeline --micro 4,8,16 --json p4.json
//
// Measurement, per step: every rank records its busy time (inside the stage
// callbacks), when its PipelineExecutor::run() started and how long it took,
// after a barrier. The step's makespan runs from rank 0's start to the last
// rank's end (one host: the ranks share the steady clock); a rank's bubble is
// 1 - busy / makespan; the step's bubble is the mean over ranks. Each
// configuration runs --warmup steps, then --repeats timed steps (in rounds
// over all configurations), and reports the step with the median bubble,
// beside three theories: the schedule simulated with the nominal costs; the
// same plus the message latency measured before the runs; and its replay —
// simulated with the durations each action really took in that step plus
// that latency — which separates the idle time the executor adds from a
// loaded machine's jitter in the emulated compute.
//
// The emulated stages also verify the data: every tensor carries (stage,
// micro-batch) and every receiver checks it (#wrong), and the executor's
// peak of live activations must equal the simulated one.
// Exit status: 0 if every check passed, 2 if some check failed, 1 on error.
#include <ATen/Functions.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/options.h"
#include "torus/comm/process_group.h"
#include "torus/core/error.h"
#include "torus/parallel/pipeline/executor.h"

namespace torus::bench {
namespace {

using pp::ScheduleKind;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<ScheduleKind> schedules{std::begin(pp::kAllScheduleKinds), std::end(pp::kAllScheduleKinds)};
  std::vector<int> micro{4, 8, 16};
  int chunks = 2;                      // v of the interleaved schedule
  pp::CostModel costs{50, 50, 50, 0};  // ms
  bool spin = false;
  int warmup = 1;
  int repeats = 3;
  int64_t elements = 256;  // f32 elements per activation message (1 KiB: eager on shared memory)
  std::string json;
  int prefetch = pp::ExecutorOptions{}.recv_prefetch;
  bool verbose = false;
  bool help = false;
};

void print_help() {
  std::printf(
      "torus-bench-pipeline — measured vs theoretical bubble of pipeline schedules.\n\n"
      "Usage: mpirun -np P torus-bench-pipeline [options]     (P = pipeline ranks)\n"
      "   eg: mpirun -np 4 torus-bench-pipeline --micro 4,8,16 --json p4.json\n\n"
      "Each rank is one pipeline stage; its compute is emulated by fixed-duration work.\n\n"
      "Options:\n"
      "      --schedules LIST   gpipe,1f1b,interleaved,zb-h1 (default: all)\n"
      "      --micro LIST       micro-batches per step (default 4,8,16); interleaved skips m not a multiple of P\n"
      "      --chunks V         chunks per rank of the interleaved schedule (default 2)\n"
      "      --t-forward MS     forward time of one micro-batch on one rank (default 50)\n"
      "      --t-backward MS    input-gradient time (default 50); a fused backward takes t-backward + t-weight\n"
      "      --t-weight MS      weight-gradient time (default 50)\n"
      "      --work sleep|spin  how compute is emulated (default sleep: needs no core)\n"
      "      --elements N       f32 elements per activation/gradient message (default 256)\n"
      "  -w, --warmup N         untimed steps per configuration (default 1)\n"
      "  -n, --repeats N        timed steps per configuration; the median is reported (default 3)\n"
      "      --json FILE        write the records as JSON (rank 0)\n"
      "      --prefetch N       receives the executor posts ahead (ExecutorOptions::recv_prefetch, default %d)\n"
      "  -v, --verbose          print every timed step (bubble, replay, makespan)\n"
      "  -h, --help             this text\n\n"
      "Columns: bubble = measured idle / makespan (mean over ranks; median of the timed steps),\n"
      "theory = simulate() with the nominal costs and zero communication time, +lat = the same with\n"
      "the message latency measured first (a stamped ping-pong to a blocked receiver; one host only),\n"
      "replay = simulate() with the durations each action really took in that step and that latency:\n"
      "what the schedule implies for the compute this machine delivered, closed = the closed form,\n"
      "err, err+lat, err/rep = measured bubble relative to theory, +lat and replay,\n"
      "live = peak live activations per rank (micro-batch x chunk pairs), measured; sim = simulated.\n",
      pp::ExecutorOptions{}.recv_prefetch);
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
  cli.option("--t-forward",
             [&](const std::string& v) { o.costs.forward = parse_nonnegative(v, "--t-forward", " in ms"); });
  cli.option("--t-backward",
             [&](const std::string& v) { o.costs.backward_input = parse_nonnegative(v, "--t-backward", " in ms"); });
  cli.option("--t-weight",
             [&](const std::string& v) { o.costs.backward_weight = parse_nonnegative(v, "--t-weight", " in ms"); });
  cli.option("--work", [&](const std::string& v) {
    if (v != "sleep" && v != "spin") throw std::invalid_argument("--work must be sleep or spin");
    o.spin = v == "spin";
  });
  cli.option("--elements", [&](const std::string& v) { o.elements = static_cast<int>(parse_int(v, "--elements", 1)); });
  cli.option("-w,--warmup", [&](const std::string& v) { o.warmup = static_cast<int>(parse_int(v, "--warmup", 0)); });
  cli.option("-n,--repeats", [&](const std::string& v) { o.repeats = static_cast<int>(parse_int(v, "--repeats", 1)); });
  cli.option("--json", [&](const std::string& v) { o.json = v; });
  cli.flag("-v,--verbose", [&] { o.verbose = true; });
  cli.option("--prefetch", [&](const std::string& v) { o.prefetch = static_cast<int>(parse_int(v, "--prefetch", 0)); });
  cli.parse(argc, argv);
  return o;
}

// A stage whose compute is a fixed-duration wait. Messages carry a marker,
// stage * 2^20 + micro, that the receiving stage checks.
class EmulatedStage : public pp::StageCallbacks {
 public:
  EmulatedStage(const pp::Schedule& s, int rank, const Options& o) : s_(s), rank_(rank), o_(o) {}

  at::Tensor forward(int micro, int chunk, const at::Tensor& input) override {
    const int stage = s_.stage(rank_, chunk);
    if (stage > 0) check(input, marker(stage - 1, micro));
    work(o_.costs.forward);
    return at::full({o_.elements}, marker(stage, micro), at::kFloat);
  }
  at::Tensor loss(int micro, const at::Tensor& output) override { return output.sum().mul(0); }
  at::Tensor backward_input(int micro, int chunk, const at::Tensor& grad_output) override {
    const int stage = s_.stage(rank_, chunk);
    if (grad_output.defined()) check(grad_output, -marker(stage + 1, micro));
    work(o_.costs.backward_input);
    return at::full({o_.elements}, -marker(stage, micro), at::kFloat);
  }
  void backward_weight(int, int) override { work(o_.costs.backward_weight); }
  at::Tensor backward(int micro, int chunk, const at::Tensor& grad_output) override {
    const int stage = s_.stage(rank_, chunk);
    if (grad_output.defined()) check(grad_output, -marker(stage + 1, micro));
    work(o_.costs.backward_input + o_.costs.backward_weight);
    return at::full({o_.elements}, -marker(stage, micro), at::kFloat);
  }

  int64_t wrong = 0;

 private:
  static float marker(int stage, int micro) { return float(stage * (1 << 20) + micro + 1); }
  void check(const at::Tensor& t, float want) { wrong += t.ne(want).sum().item<int64_t>(); }
  // Work of `ms` for one micro-batch through the whole rank; a chunk does 1/v.
  void work(double ms) const {
    const auto until = Clock::now() + std::chrono::duration<double, std::milli>(ms / s_.num_chunks);
    if (o_.spin) {
      while (Clock::now() < until) {
      }
    } else {
      std::this_thread::sleep_until(until);
    }
  }

  const pp::Schedule& s_;
  const int rank_;
  const Options& o_;
};

// One-way latency of a pipeline message to a receiver already blocked in
// its receive (the situation on a pipeline's critical path), in ms: rank 0
// and rank 1 take turns to sleep, stamp the steady clock into a message of
// the benchmark's size and send it; the receiver subtracts the stamp on
// arrival. Both ranks read the same clock, so this needs one host; returns
// the median over `rounds` messages each way, or -1 with fewer than 2 ranks
// or more than one host.
double probe_latency_ms(const comm::ProcessGroupPtr& world, const Options& o, int rounds = 20) {
  if (world->size() < 2 || world->context()->hosts().num_hosts() != 1) return -1;
  const int rank = world->rank();
  std::vector<double> samples;
  const int64_t n = std::max<int64_t>(o.elements / 2, 1);  // f64: the same bytes as the f32 messages
  auto now = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  for (int i = 0; i < 2 * rounds; ++i) {
    const int sender = i % 2;
    if (rank == sender) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      at::Tensor msg = at::full({n}, now(), at::kDouble);
      world->send(msg, 1 - sender, comm::SendRecvOptions{1})->wait();
    } else if (rank == 1 - sender) {
      at::Tensor msg = at::empty({n}, at::kDouble);
      world->recv(msg, sender, comm::SendRecvOptions{1})->wait();
      samples.push_back((now() - msg[0].item<double>()) * 1e3);
    }
  }
  at::Tensor median = at::zeros({1}, at::kDouble);
  if (rank <= 1) {
    std::sort(samples.begin(), samples.end());
    median[0] = samples[samples.size() / 2] / 2;  // each of ranks 0 and 1 holds one direction
  }
  world->all_reduce(median)->wait();
  return median.item<double>();
}

struct Record {
  std::string schedule;
  int p = 0, m = 0, v = 1;
  double step_ms = 0, bubble = 0, theory = 0, theory_lat = 0, replay = 0, closed = 0;
  std::vector<double> bubble_per_rank;
  std::vector<int> peak_live, peak_live_sim;
  int64_t wrong = 0;
  bool live_ok = true;
  double rel_err() const { return theory > 0 ? (bubble - theory) / theory : 0.0; }
  double rel_err_lat() const { return theory_lat > 0 ? (bubble - theory_lat) / theory_lat : 0.0; }
  double rel_err_replay() const { return replay > 0 ? (bubble - replay) / replay : 0.0; }
};

// One configuration (schedule, p, m, v) and its measurements. Per timed
// step and rank the executor records busy time, wall time, start (origin)
// and the duration of every action; on one host the step's makespan runs
// from rank 0's start (the first forward starts the pipeline) to the last
// rank's end, else it is the longest wall time. record() reports the timed
// step whose bubble is the median.
class Case {
 public:
  Case(const comm::ProcessGroupPtr& world, ScheduleKind kind, pp::Schedule s, const Options& o)
      : world_(world),
        kind_(kind),
        s_(std::move(s)),
        o_(o),
        sim_(pp::simulate(s_, o.costs)),
        stage_(s_, world->rank(), o) {
    pp::ExecutorOptions eo;
    eo.edge_specs = {pp::TensorSpec{{o.elements}, at::kFloat}};
    eo.record_trace = true;
    eo.recv_prefetch = o.prefetch;
    exec_ = std::make_unique<pp::PipelineExecutor>(world, eo);
    for (const auto& list : s_.actions) longest_ = std::max(longest_, static_cast<int64_t>(list.size()));
    mine_ = at::zeros({o.repeats, kHead + longest_}, at::kDouble);
  }

  // One step; `timed` >= 0 stores its measurements as timed step `timed`.
  void step(int timed) {
    world_->barrier()->wait();
    pp::StepResult r = exec_->run(s_, stage_);
    if (timed < 0) return;
    auto x = mine_.accessor<double, 2>()[timed];
    x[0] = r.busy;
    x[1] = r.wall;
    x[2] = r.origin;
    x[3] = r.peak_live;
    for (size_t i = 0; i < r.trace.size(); ++i) x[kHead + i] = (r.trace[i].end - r.trace[i].start) * 1e3;
  }

  // Collective: gathers every rank's measurements; meaningful on rank 0.
  Record record(double latency_ms) {
    const int p = world_->size();
    const bool one_host = world_->context()->hosts().num_hosts() == 1;
    at::Tensor all = at::zeros({p, o_.repeats, kHead + longest_}, at::kDouble);
    world_->all_gather(mine_, all)->wait();
    at::Tensor wrong = at::full({1}, stage_.wrong, at::kLong);
    world_->all_reduce(wrong)->wait();

    Record rec;
    rec.schedule = std::string(pp::schedule_kind_name(kind_));
    rec.p = p;
    rec.m = s_.num_micro;
    rec.v = s_.num_chunks;
    rec.theory = sim_.bubble();
    pp::CostModel with_latency = o_.costs;
    with_latency.comm = std::max(latency_ms, 0.0);
    rec.theory_lat = pp::simulate(s_, with_latency).bubble();
    rec.closed = pp::closed_form_bubble(kind_, p, s_.num_micro, s_.num_chunks, o_.costs);
    rec.wrong = wrong.item<int64_t>();
    auto a = all.accessor<double, 3>();
    struct StepStat {
      double bubble, makespan, replay;
      int it;
    };
    std::vector<StepStat> steps;
    for (int it = 0; it < o_.repeats; ++it) {
      double makespan = 0;
      for (int r = 0; r < p; ++r) {
        makespan = std::max(makespan, one_host ? a[r][it][2] + a[r][it][1] - a[0][it][2] : a[r][it][1]);
      }
      double bubble = 0;
      for (int r = 0; r < p; ++r) bubble += (1.0 - a[r][it][0] / makespan) / p;
      std::vector<std::vector<double>> durations(p);
      for (int r = 0; r < p; ++r) {
        for (size_t i = 0; i < s_.actions[r].size(); ++i) durations[r].push_back(a[r][it][kHead + i]);
      }
      const double replay = pp::simulate(s_, durations, std::max(latency_ms, 0.0)).bubble();
      steps.push_back({bubble, makespan, replay, it});
      if (o_.verbose && world_->rank() == 0) {
        std::printf("#   %s m=%d step %d: bubble %.4f replay %.4f makespan %.1f ms\n", s_.name.c_str(), s_.num_micro,
                    it, bubble, replay, makespan * 1e3);
      }
    }
    std::sort(steps.begin(), steps.end(), [](const StepStat& x, const StepStat& y) { return x.bubble < y.bubble; });
    const StepStat& med = steps[steps.size() / 2];
    rec.step_ms = med.makespan * 1e3;
    rec.bubble = med.bubble;
    rec.replay = med.replay;
    for (int r = 0; r < p; ++r) {
      rec.bubble_per_rank.push_back(1.0 - a[r][med.it][0] / med.makespan);
      rec.peak_live.push_back(static_cast<int>(a[r][med.it][3]));
      rec.peak_live_sim.push_back(sim_.ranks[r].peak_live);
      rec.live_ok = rec.live_ok && rec.peak_live.back() == rec.peak_live_sim.back();
    }
    return rec;
  }

 private:
  static constexpr int kHead = 4;  // busy, wall, origin, peak live; then action durations (ms)
  comm::ProcessGroupPtr world_;
  ScheduleKind kind_;
  pp::Schedule s_;
  const Options& o_;
  pp::Simulation sim_;
  EmulatedStage stage_;
  std::unique_ptr<pp::PipelineExecutor> exec_;
  int64_t longest_ = 0;
  at::Tensor mine_;
};

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

void print_row(const Record& r) {
  std::printf("%-12s %3d %4d %3d %9.1f %8.4f %8.4f %8.4f %8.4f %8.4f %+7.1f%% %+7.1f%% %+7.1f%% %6lld  %-12s %-12s\n",
              r.schedule.c_str(), r.p, r.m, r.v, r.step_ms, r.bubble, r.theory, r.theory_lat, r.replay, r.closed,
              100 * r.rel_err(), 100 * r.rel_err_lat(), 100 * r.rel_err_replay(), static_cast<long long>(r.wrong),
              join(r.peak_live).c_str(), join(r.peak_live_sim).c_str());
  std::fflush(stdout);
}

bool write_json(const std::string& path, const std::vector<Record>& records, const Options& o, double latency_ms) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "torus-bench-pipeline: cannot write %s\n", path.c_str());
    return false;
  }
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    std::string per_rank;
    for (size_t k = 0; k < r.bubble_per_rank.size(); ++k) {
      per_rank += (k ? ", " : "") + std::to_string(r.bubble_per_rank[k]);
    }
    std::fprintf(f,
                 "  {\"schedule\": \"%s\", \"p\": %d, \"m\": %d, \"v\": %d, \"t_forward_ms\": %g, "
                 "\"t_backward_ms\": %g, \"t_weight_ms\": %g, \"work\": \"%s\", \"elements\": %lld, "
                 "\"repeats\": %d, \"latency_ms\": %.4f, \"step_ms\": %.3f, \"bubble\": %.6f, "
                 "\"bubble_theory\": %.6f, \"bubble_theory_latency\": %.6f, \"bubble_replay\": %.6f, "
                 "\"bubble_closed_form\": %.6f, \"rel_err\": %.6f, \"rel_err_latency\": %.6f, "
                 "\"rel_err_replay\": %.6f, \"bubble_per_rank\": [%s], \"peak_live\": [%s], "
                 "\"peak_live_theory\": [%s], \"wrong\": %lld}%s\n",
                 r.schedule.c_str(), r.p, r.m, r.v, o.costs.forward, o.costs.backward_input, o.costs.backward_weight,
                 o.spin ? "spin" : "sleep", static_cast<long long>(o.elements), o.repeats, latency_ms, r.step_ms,
                 r.bubble, r.theory, r.theory_lat, r.replay, r.closed, r.rel_err(), r.rel_err_lat(), r.rel_err_replay(),
                 per_rank.c_str(), join(r.peak_live).c_str(), join(r.peak_live_sim).c_str(),
                 static_cast<long long>(r.wrong), i + 1 < records.size() ? "," : "");
  }
  std::fprintf(f, "]\n");
  return std::fclose(f) == 0;
}

int run(const Options& o) {
  auto world = torus::init();
  const int p = world->size();
  const bool root = world->rank() == 0;
  const double latency_ms = probe_latency_ms(world, o);
  if (root) {
    std::printf(
        "# torus-bench-pipeline: p=%d ranks, t_F=%g t_B=%g t_W=%g ms per micro-batch and rank (%s), "
        "interleaved v=%d, %d warm-up + %d timed steps (median)\n",
        p, o.costs.forward, o.costs.backward_input, o.costs.backward_weight, o.spin ? "spin" : "sleep", o.chunks,
        o.warmup, o.repeats);
    char latency[32] = "not measured";
    if (latency_ms >= 0) std::snprintf(latency, sizeof latency, "%.3f ms", latency_ms);
    std::printf("# message latency to a blocked receiver: %s (%lld B messages)\n", latency,
                static_cast<long long>(o.elements * 4));
    std::printf("%-12s %3s %4s %3s %9s %8s %8s %8s %8s %8s %8s %8s %8s %6s  %-12s %-12s\n", "schedule", "p", "m", "v",
                "step_ms", "bubble", "theory", "+lat", "replay", "closed", "err", "err+lat", "err/rep", "#wrong",
                "live", "sim");
  }
  // Configurations run in rounds — every configuration once per round — so
  // that a burst of load on the machine hits different steps of many
  // configurations rather than every step of one.
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
      cases.push_back(std::make_unique<Case>(world, kind, pp::make_schedule({kind, p, m, v}), o));
    }
  }
  for (int round = 0; round < o.warmup + o.repeats; ++round) {
    for (auto& c : cases) c->step(round - o.warmup);
  }
  std::vector<Record> records;
  bool ok = true;
  for (auto& c : cases) {
    Record r = c->record(latency_ms);
    ok = ok && r.wrong == 0 && r.live_ok;
    if (root) print_row(r);
    records.push_back(std::move(r));
  }
  if (root) {
    int within = 0, within_lat = 0, within_replay = 0;
    for (const auto& r : records) {
      within += std::abs(r.rel_err()) <= 0.10 ? 1 : 0;
      within_lat += std::abs(r.rel_err_lat()) <= 0.10 ? 1 : 0;
      within_replay += std::abs(r.rel_err_replay()) <= 0.10 ? 1 : 0;
    }
    std::printf("# within 10%% of theory: %d of %zu configurations; of theory with latency: %d; of the replay: %d\n",
                within, records.size(), within_lat, within_replay);
    std::map<int, double> f1b;
    for (const auto& r : records) {
      if (r.schedule == "1f1b") f1b[r.m] = r.bubble;
    }
    for (const auto& r : records) {
      if (r.schedule == "zb-h1" && f1b.count(r.m)) {
        std::printf("# m=%d: ZB-H1 bubble %.4f = %.2f x 1F1B's %.4f\n", r.m, r.bubble, r.bubble / f1b[r.m], f1b[r.m]);
      }
    }
    std::printf("# checks: %s\n", ok ? "all data and live-activation peaks as expected" : "FAILED");
    if (!o.json.empty() && !write_json(o.json, records, o, latency_ms)) return 1;
  }
  world->barrier()->wait();
  return ok ? 0 : 2;
}

}  // namespace
}  // namespace torus::bench

int main(int argc, char** argv) {
  torus::bench::Options o;
  try {
    o = torus::bench::parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-bench-pipeline: %s\n", e.what());
    return 1;
  }
  if (o.help) {
    torus::bench::print_help();
    return 0;
  }
  try {
    return torus::bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-bench-pipeline: error: %s\n", e.what());
    return 1;
  }
}
