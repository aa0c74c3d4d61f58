// bench/common/options.cpp — see options.h.
#include "options.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "sweep.h"

namespace torus::bench {

std::vector<size_t> SweepOptions::sweep() const {
  return sizes.empty() ? size_sweep(min_bytes, max_bytes, factor) : sizes;
}

void add_sweep_options(Cli& cli, SweepOptions& o, const std::vector<std::string>& default_ops,
                       const std::vector<std::string>& known_ops) {
  o.ops = default_ops;
  cli.flag("-h,--help", [&o] { o.help = true; });
  cli.option("-b,--minbytes", [&o](const std::string& v) { o.min_bytes = parse_size(v); });
  cli.option("-e,--maxbytes", [&o](const std::string& v) { o.max_bytes = parse_size(v); });
  cli.option("-f,--stepfactor", [&o](const std::string& v) { o.factor = std::stod(v); });
  cli.option("--sizes", [&o](const std::string& v) {
    for (const std::string& s : split_list(v)) o.sizes.push_back(parse_size(s));
  });
  cli.option("--ops", [&o, known_ops](const std::string& v) {
    o.ops = split_list(v);
    for (const std::string& op : o.ops) {
      if (std::find(known_ops.begin(), known_ops.end(), op) == known_ops.end()) {
        std::string known;
        for (const std::string& k : known_ops) known += (known.empty() ? "" : ", ") + k;
        throw std::invalid_argument("unknown op '" + op + "' (known: " + known + ")");
      }
    }
  });
  int_option(cli, "-n,--iters", o.iters, 1, "--iters");
  int_option(cli, "-w,--warmup", o.warmup, 0, "--warmup");
  cli.option("--settle-ms",
             [&o](const std::string& v) { o.settle_ms = parse_nonnegative(v, "--settle-ms", " in ms"); });
  cli.option("--iter-budget", [&o](const std::string& v) { o.iter_budget = parse_size(v); });
  cli.flag("--check", [&o] { o.check = true; });
  cli.flag("--no-check", [&o] { o.check = false; });
  cli.option("-c", [&o](const std::string& v) { o.check = v != "0"; });  // nccl-tests spelling: -c 0|1
  cli.flag("--no-probe", [&o] { o.probe = false; });
  cli.option("--json", [&o](const std::string& v) { o.json = v; });
}

void check_sweep_options(const SweepOptions& o) {
  if (o.min_bytes > o.max_bytes) throw std::invalid_argument("--minbytes is larger than --maxbytes");
  (void)o.sweep();  // validates the factor
}

std::string sweep_options_help() {
  return R"(Size sweep (nccl-tests style):
  -b, --minbytes SIZE    smallest size (default 8); SIZE: 8, 1K, 64M, 1G (powers of 1024)
  -e, --maxbytes SIZE    largest size (default 256M)
  -f, --stepfactor F     multiply the size by F each step (default 2)
      --sizes LIST       explicit comma-separated sizes instead of -b/-e/-f
      --ops LIST         comma-separated ops (default: all this tool knows)
  -n, --iters N          timed iterations per size and placement (default 20)
  -w, --warmup N         warm-up iterations (default 5)
      --settle-ms MS     before the sweep, 8-byte all-reduces back to back for MS ms, so that
                         the scheduler has spread the ranks over the cores (default 200)
      --iter-budget SIZE cap iterations so that size * iterations <= SIZE (default 1G);
                         never fewer than 3 timed iterations
      --check, --no-check
                         verify every measured size (default: on); -c 0|1 also works
      --no-probe         skip the single-core memcpy probe
      --json FILE        also write the results as JSON records (rank 0)
  -h, --help             this text
)";
}

}  // namespace torus::bench
