// torus-bench-cpu-adam: Torus's CPU Adam kernel (cpu_adam_kernel.h), one
// AdamW step over f32 parameters, gradients and moments, beside the memory
// bandwidth limit (28 bytes per parameter per step: param, grad, m and v
// read, param, m and v written) at the bandwidth measured in the same run.
// bench/optim/run.py runs it and puts torch.optim.AdamW and DeepSpeed's CPU
// Adam beside it.
//
//   torus-bench-cpu-adam [--threads 1,2] [--cases 1M,16M,64M,100x1M] [--min-seconds 1] [--json FILE]
//
// Each case is verified first: one step of the kernel against ATen's fused
// AdamW (what torch.optim.AdamW(fused=True) runs) on the same inputs, to
// 1e-6 relative; a failed check exits 1 before anything is timed.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/membw.h"
#include "common/options.h"
#include "torus/optim/cpu_adam.h"

namespace {

using torus::optim::cpu::AdamHyper;
namespace cpu = torus::optim::cpu;

constexpr double kBytesPerParam = 28.0;

struct Case {
  std::string name;
  int64_t tensors = 1;
  int64_t numel = 0;  // per tensor
};

Case parse_case(const std::string& s) {
  auto count = [](std::string v) -> int64_t {
    int64_t mult = 1;
    if (!v.empty() && (v.back() == 'M' || v.back() == 'K')) {
      mult = v.back() == 'M' ? (int64_t{1} << 20) : 1024;
      v.pop_back();
    }
    return torus::bench::parse_int(v, "--cases", 1) * mult;
  };
  const auto x = s.find('x');
  if (x == std::string::npos) return {s, 1, count(s)};
  const int64_t tensors = torus::bench::parse_int(s.substr(0, x), "--cases", 1);
  return {s, tensors, count(s.substr(x + 1)) / tensors};
}

struct State {
  std::vector<at::Tensor> p, g, m, v;
};

State make_state(const Case& c, uint64_t seed) {
  at::manual_seed(seed);
  State s;
  for (int64_t k = 0; k < c.tensors; ++k) {
    s.p.push_back(at::randn({c.numel}));
    s.g.push_back(at::randn({c.numel}));
    s.m.push_back(at::randn({c.numel}).mul_(0.01));
    s.v.push_back(at::rand({c.numel}).mul_(0.01));
  }
  return s;
}

AdamHyper hyper(int64_t step) {
  return {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .decoupled = true, .step = step};
}

// One step of the kernel and of ATen's fused AdamW from the same state.
double verify(const Case& c, int threads) {
  State a = make_state(c, 1), b = make_state(c, 1);
  cpu::adam_update(hyper(1), a.p, a.g, a.m, a.v, {}, threads);
  std::vector<at::Tensor> steps;
  for (int64_t k = 0; k < c.tensors; ++k) steps.push_back(at::ones({}));
  at::_fused_adamw_(b.p, b.g, b.m, b.v, {}, steps, 1e-3, 0.9, 0.999, 0.01, 1e-8, false, false);
  double worst = 0;
  for (int64_t k = 0; k < c.tensors; ++k) {
    for (auto [x, y] : {std::pair{&a.p[k], &b.p[k]}, {&a.m[k], &b.m[k]}, {&a.v[k], &b.v[k]}}) {
      const double scale = y->abs().max().item<double>();
      worst = std::max(worst, (*x - *y).abs().max().item<double>() / scale);
    }
  }
  return worst;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median seconds of one step, over at least 5 steps and min_seconds.
double time_steps(const Case& c, int threads, double min_seconds, int& runs) {
  State s = make_state(c, 2);
  int64_t step = 1;
  for (int w = 0; w < 2; ++w) cpu::adam_update(hyper(step++), s.p, s.g, s.m, s.v, {}, threads);
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  while (times.size() < 5 || (seconds_since(start) < min_seconds && times.size() < 1000)) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::adam_update(hyper(step++), s.p, s.g, s.m, s.v, {}, threads);
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  runs = static_cast<int>(times.size());
  return times[times.size() / 2];
}

// The copy bandwidth of `threads` cores at once (each its own 64 MiB
// memcpy_probe), as read+write traffic in GB/s.
double traffic_gbps(int threads) {
  std::vector<torus::bench::MemcpyProbe> probes(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back([&probes, t] { probes[t] = torus::bench::memcpy_probe(); });
  for (auto& th : pool) th.join();
  double gbps = 0;
  for (const auto& p : probes) gbps += 2.0 * p.gbps;  // a copy reads and writes its bytes
  return gbps;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<int> threads = {1, 2};
  std::vector<Case> cases;
  std::string case_list = "1M,16M,64M,100x1M";
  double min_seconds = 1.0;
  std::string json_path;
  torus::bench::Cli cli;
  cli.option("--threads", [&](const std::string& v) {
    threads.clear();
    for (const auto& t : torus::bench::split_list(v)) {
      threads.push_back(static_cast<int>(torus::bench::parse_int(t, "--threads", 1)));
    }
  });
  cli.option("--cases", [&](const std::string& v) { case_list = v; });
  cli.option("--min-seconds",
             [&](const std::string& v) { min_seconds = torus::bench::parse_nonnegative(v, "--min-seconds", " s"); });
  cli.option("--json", [&](const std::string& v) { json_path = v; });
  cli.parse(argc, argv);
  for (const auto& c : torus::bench::split_list(case_list)) cases.push_back(parse_case(c));

  nlohmann::json out;
  out["isa"] = std::string(cpu::isa_name(cpu::best_isa()));
  out["bytes_per_param"] = kBytesPerParam;
  std::printf("# Torus CPU Adam (AdamW step, f32 param/grad/m/v), ISA %s\n", out["isa"].get<std::string>().c_str());
  for (int t : threads) {
    const double gbps = traffic_gbps(t);
    out["bandwidth_gbps"][std::to_string(t)] = gbps;
    std::printf("# memcpy traffic (read + write), %d thread(s): %.2f GB/s -> limit %.1f Mparam/s\n", t, gbps,
                gbps * 1e9 / kBytesPerParam / 1e6);
  }
  std::printf("%-10s %8s %8s %12s %14s %10s %12s\n", "case", "params", "threads", "median_ms", "Mparam/s",
              "x_limit", "check");
  for (const Case& c : cases) {
    for (int t : threads) {
      at::set_num_threads(t);
      const double err = verify(c, t);
      if (!(err <= 1e-6)) {
        std::fprintf(stderr, "verification failed: %s, %d threads: %.3g relative to ATen's fused AdamW\n",
                     c.name.c_str(), t, err);
        return 1;
      }
      int runs = 0;
      const double sec = time_steps(c, t, min_seconds, runs);
      const double total = static_cast<double>(c.tensors * c.numel);
      const double rate = total / sec;
      const double limit = out["bandwidth_gbps"][std::to_string(t)].get<double>() * 1e9 / kBytesPerParam;
      std::printf("%-10s %8.0f %8d %12.3f %14.1f %10.2f %12.1e\n", c.name.c_str(), total, t, sec * 1e3, rate / 1e6,
                  rate / limit, err);
      out["rows"].push_back({{"case", c.name},
                             {"tensors", c.tensors},
                             {"params", c.tensors * c.numel},
                             {"threads", t},
                             {"impl", "torus (C++)"},
                             {"median_s", sec},
                             {"runs", runs},
                             {"params_per_s", rate},
                             {"max_rel_err_vs_aten_fused", err}});
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "torus-bench-cpu-adam: %s\n", e.what());
  return 2;
}
