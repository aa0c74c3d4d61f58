// bench/common/cli.h — the command lines of the benchmarks and of the
// randomized collective test (tests/backend/random_options.cpp), read with
// CLI11. Header-only (CLI11 is), so that a test can use it without the
// benchmarks being built, and free of Torus.
//
// The conventions every program keeps: options in any order as
// "--name value", "--name=value" or "-n value"; a repeated option's last
// value wins (a script may append an override); a flag may be repeated;
// anything unknown is refused. Each program keeps its own help text:
// -h/--help is an ordinary flag it registers. Values are handed to the
// program's own setter, which converts and checks them (parse_int and
// friends below) and throws std::invalid_argument with a message for the
// user; parse() turns CLI11's own errors (an unknown argument, a missing
// value) into std::invalid_argument too.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace torus::bench {

class Cli {
 public:
  Cli() {
    app_.set_help_flag();  // each program has its own
    app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }

  // An option with a value ("-b,--minbytes"): `set` receives the value of
  // its last occurrence, after the whole line was read; options are set in
  // the order they were declared.
  void option(const std::string& names, std::function<void(const std::string&)> set) {
    app_.add_option_function<std::string>(names, std::move(set))->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  // A flag: `set` runs once when it is given (however often).
  void flag(const std::string& names, std::function<void()> set) {
    app_.add_flag_function(names, [set = std::move(set)](std::int64_t count) {
      if (count > 0) set();
    });
  }

  // Reads argv[1..argc). Throws std::invalid_argument (CLI11's message, or
  // a setter's).
  void parse(int argc, char** argv) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      throw std::invalid_argument(std::string(e.what()) + " (see --help)");
    }
  }

 private:
  CLI::App app_;
};

// "a,b,,c" -> {"a", "b", "c"} (empty items dropped).
inline std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    if (end > start) items.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

// The whole of `s` as an integer >= min, or std::invalid_argument naming
// `what` ("--micro must be an integer >= 1, got 'x'").
inline int64_t parse_int(const std::string& s, const char* what, int64_t min) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || v < min) {
    throw std::invalid_argument(std::string(what) + " must be an integer >= " + std::to_string(min) + ", got '" + s +
                                "'");
  }
  return v;
}

// The whole of `s` as a number >= 0 (`unit`, e.g. " in ms", ends the message).
inline double parse_nonnegative(const std::string& s, const char* what, const char* unit = "") {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(v >= 0)) {
    throw std::invalid_argument(std::string(what) + " must be a number >= 0" + unit + ", got '" + s + "'");
  }
  return v;
}

// Declares option `names` ("-n,--iters") that sets `dest` to an integer >=
// min that fits T; errors name `what` (default: `names`).
template <typename T>
void int_option(Cli& cli, const char* names, T& dest, int64_t min = 1, const char* what = nullptr) {
  if (what == nullptr) what = names;
  cli.option(names, [what, &dest, min](const std::string& v) {
    const int64_t x = parse_int(v, what, min);
    if (x > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      throw std::invalid_argument(std::string(what) + " must be an integer >= " + std::to_string(min) +
                                  " that fits, got '" + v + "'");
    }
    dest = static_cast<T>(x);
  });
}

}  // namespace torus::bench
