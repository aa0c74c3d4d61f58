// bench/common/options.h — command-line handling shared by the collective
// benchmarks: a tiny argument reader, and the sweep options they all accept
// (-b/-e/-f or --sizes, --ops, --iters, --warmup, --iter-budget, --check,
// --json, --no-probe), with their help text. Standard library only.
#pragma once

#include <cstdint>

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torus::bench {

// Consumes options in any order: "--name value", "--name=value", "-n value",
// or bare flags. finish() rejects whatever was not consumed. Errors throw
// std::invalid_argument with a message meant for the user.
class Args {
 public:
  Args(int argc, char** argv);
  bool flag(std::initializer_list<std::string_view> names);
  std::optional<std::string> value(std::initializer_list<std::string_view> names);
  void finish() const;

 private:
  std::vector<std::string> args_;
  std::vector<bool> used_;
};

// "a,b,,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_list(const std::string& s);
// The whole of `s` as an integer >= min, or std::invalid_argument naming
// `what` ("--micro must be an integer >= 1, got 'x'").
int64_t parse_int(const std::string& s, const char* what, int64_t min);
// Sets `dest` from option `name` when it is given: an integer >= min
// (std::invalid_argument otherwise).
template <typename T>
void read_int(Args& args, const char* name, T& dest, int64_t min = 1) {
  if (auto v = args.value({name})) dest = static_cast<T>(parse_int(*v, name, min));
}

// The whole of `s` as a number >= 0 (`unit`, e.g. " in ms", ends the message).
double parse_nonnegative(const std::string& s, const char* what, const char* unit = "");

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

// Reads the options above; `default_ops` when --ops is absent. Validates op
// names against `known_ops`.
SweepOptions parse_sweep_options(Args& args, const std::vector<std::string>& default_ops,
                                 const std::vector<std::string>& known_ops);

// Help lines for the options above.
std::string sweep_options_help();

}  // namespace torus::bench
