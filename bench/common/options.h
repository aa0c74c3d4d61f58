// bench/common/options.h — the sweep options every collective benchmark
// accepts (-b/-e/-f or --sizes, --ops, --iters, --warmup, --iter-budget,
// --check, --json, --no-probe), declared on the shared command line
// (cli.h), with their help text. Free of Torus.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cli.h"

namespace torus::bench {

struct SweepOptions {
  size_t min_bytes = 8;
  size_t max_bytes = size_t{256} << 20;
  double factor = 2.0;
  std::vector<size_t> sizes;  // explicit list; overrides min/max/factor
  std::vector<std::string> ops;
  int iters = 20;
  int warmup = 5;
  // Before the sweep, small all-reduces back to back for this long (rank 0's
  // clock): ranks launched together often start on one core, and the
  // scheduler takes some milliseconds to spread them; without it the first
  // small sizes can measure that start-up (8.5 us instead of 0.4 us per op
  // for 8 B was seen here).
  double settle_ms = 200;
  size_t iter_budget = size_t{1} << 30;
  bool check = true;
  bool probe = true;
  std::string json;
  bool help = false;

  std::vector<size_t> sweep() const;
};

// Declares the options above on `cli`, to be read into `o`: `default_ops`
// when --ops is absent; op names are checked against `known_ops`.
void add_sweep_options(Cli& cli, SweepOptions& o, const std::vector<std::string>& default_ops,
                       const std::vector<std::string>& known_ops);
// After cli.parse(): the checks that span options (--minbytes <=
// --maxbytes, a usable --stepfactor). Throws std::invalid_argument.
void check_sweep_options(const SweepOptions& o);

// Help lines for the options above.
std::string sweep_options_help();

}  // namespace torus::bench
