// One rank of the killed-peer check (driven by killed_peer_test.py under
// `mpirun --mca orte_enable_recovery 1`, so that mpirun leaves the survivors
// running when a rank dies).
//
// Every rank builds a Context (host backend from TORUS_BACKEND) and runs
// all_reduce steps on the world group, checking each result against its
// closed form. At step --fail-step the victim issues its all_reduce, waits
// --kill-delay-ms (so the peers are inside the op) and kills itself with
// SIGKILL (--fault kill), or stops itself with SIGSTOP (--fault stop: a rank
// that is alive but will never come; the driver kills it at the end). From
// that step on the ops have the short deadline --deadline-ms; the survivors
// must see TimeoutError or CommError and tear down everything: the backend,
// then the Context (store check-out, the MPI runtime). They do not call
// Context::mark_failed: the failed op alone must keep the teardown from
// waiting for the dead rank.
//
// Each rank writes OUT/rank<r>.txt (key=value lines: outcome, error type and
// message, times). The victim writes OUT/death.txt (rank, pid, time) just
// before it dies or stops.
// Exit status: 3 for a survivor that saw the expected error and tore down
// (kExitPeerFailed), 1 for any other outcome; the victim dies by SIGKILL.
// Times are wall-clock seconds (system_clock) so that the driver can compare
// them across processes.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <mpi.h>

#include "torus/comm/context.h"
#include "torus/core/error.h"

namespace {

using namespace torus;
using namespace torus::comm;

constexpr int kExitPeerFailed = 3;
constexpr int kExitWrong = 1;
constexpr size_t kCount = size_t{1} << 16;

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Args {
  int victim = -1;  // default: the last rank
  int fail_step = 3;
  int steps = 6;
  int deadline_ms = 3000;
  int kill_delay_ms = 5;
  // Elements of the all_reduce the victim dies in: 32 MiB of f32, so that it
  // usually dies with its part of the op half done.
  size_t fail_count = size_t{1} << 23;
  std::string fault = "kill";  // or "stop"
  std::string out = ".";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--victim") a.victim = std::atoi(v.c_str());
    else if (k == "--fail-step") a.fail_step = std::atoi(v.c_str());
    else if (k == "--steps") a.steps = std::atoi(v.c_str());
    else if (k == "--deadline-ms") a.deadline_ms = std::atoi(v.c_str());
    else if (k == "--kill-delay-ms") a.kill_delay_ms = std::atoi(v.c_str());
    else if (k == "--fault") a.fault = v;
    else if (k == "--fail-count") a.fail_count = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--out") a.out = v;
    else {
      std::fprintf(stderr, "killed_peer_check: unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

// One line per key, the message with newlines flattened.
void write_report(const std::string& path, const std::vector<std::pair<std::string, std::string>>& kv) {
  std::ofstream f(path + ".tmp");
  for (auto [k, v] : kv) {
    for (char& c : v) {
      if (c == '\n') c = ' ';
    }
    f << k << '=' << v << '\n';
  }
  f.close();
  std::rename((path + ".tmp").c_str(), path.c_str());
}

int run(const Args& a) {
  const double t_start = wall_now();
  std::shared_ptr<Context> ctx = Context::create();
  BackendPtr world = ctx->host_backend();
  const int me = world->rank(), n = world->size();
  const int victim = a.victim >= 0 ? a.victim : n - 1;
  const std::string report = a.out + "/rank" + std::to_string(me) + ".txt";
  std::vector<float> x(std::max(kCount, a.fail_count));
  // sum over ranks of (r + 1) * (step + 1), exact in f32.
  auto expected = [n](int step) { return static_cast<float>(n * (n + 1) / 2 * (step + 1)); };

  std::string outcome = "no-error", error_type, message;
  int failed_step = -1;
  double t_issue = 0, t_error = 0;
  for (int step = 0; step < a.steps && failed_step < 0; ++step) {
    const size_t count = step == a.fail_step ? a.fail_count : kCount;
    std::fill(x.begin(), x.begin() + count, static_cast<float>((me + 1) * (step + 1)));
    const bool short_deadline = step >= a.fail_step;
    const Duration deadline = short_deadline ? Duration(a.deadline_ms) : std::chrono::seconds(60);
    t_issue = wall_now();
    try {
      WorkPtr work = world->all_reduce(x.data(), x.data(), count, DType::kF32, ReduceOp::kSum, deadline);
      if (me == victim && step == a.fail_step) {
        std::this_thread::sleep_for(std::chrono::milliseconds(a.kill_delay_ms));
        write_report(a.out + "/death.txt", {{"rank", std::to_string(me)},
                                            {"pid", std::to_string(getpid())},
                                            {"time", fmt::format("{:.6f}", wall_now())}});
        raise(a.fault == "stop" ? SIGSTOP : SIGKILL);
      }
      work->wait();
      const auto bad = std::count_if(x.begin(), x.begin() + count, [&](float v) { return v != expected(step); });
      if (bad > 0) {
        outcome = "wrong-value";
        message = fmt::format("step {}: {} of {} elements differ from {}", step, bad, count, expected(step));
        failed_step = step;
      }
    } catch (const TimeoutError& e) {
      outcome = "error";
      error_type = "TimeoutError";
      message = e.what();
      failed_step = step;
    } catch (const CommError& e) {
      outcome = "error";
      error_type = "CommError";
      message = e.what();
      failed_step = step;
    }
    t_error = wall_now();
  }

  // Teardown: every backend and the Context (store check-out, MPI runtime).
  const double t_teardown = wall_now();
  world.reset();
  ctx.reset();
  const double t_done = wall_now();
  int finalized = 0;
  MPI_Finalized(&finalized);  // informational: whether the teardown finalized MPI

  const bool as_expected = outcome == "error" && failed_step >= a.fail_step;
  write_report(report, {{"rank", std::to_string(me)},
                        {"size", std::to_string(n)},
                        {"victim", std::to_string(victim)},
                        {"outcome", outcome},
                        {"error_type", error_type},
                        {"failed_step", std::to_string(failed_step)},
                        {"message", message},
                        {"start", fmt::format("{:.6f}", t_start)},
                        {"issue", fmt::format("{:.6f}", t_issue)},
                        {"error", fmt::format("{:.6f}", t_error)},
                        {"teardown_s", fmt::format("{:.3f}", t_done - t_teardown)},
                        {"mpi_finalized", std::to_string(finalized)},
                        {"done", fmt::format("{:.6f}", t_done)}});
  return as_expected ? kExitPeerFailed : kExitWrong;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  if (a.fault != "kill" && a.fault != "stop") {
    std::fprintf(stderr, "killed_peer_check: --fault must be kill or stop\n");
    return 2;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "killed_peer_check: %s\n", e.what());
    return kExitWrong;
  }
}
