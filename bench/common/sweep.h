// bench/common/sweep.h — the rules every collective benchmark shares, so that
// torus-bench-comm, the raw Open MPI peer and (re-stated in Python) the gloo
// peer measure exactly the same thing: which sizes, how many elements per
// size and op, how many iterations, how bus bandwidth is derived, and which
// statistic is reported. Header only, standard library only.
//
// Size and count (as nccl-tests): "size" is the bytes of the larger buffer of
// one rank, "count" its elements.
//  * all_reduce, broadcast, reduce: count = size / elt (at least 1).
//  * reduce_scatter (input), all_gather (output), all_to_all (either): count
//    is rounded down to a multiple of the rank count n (at least n); each rank
//    contributes or receives blocks of count / n elements.
//
// Bus bandwidth (nccl-tests' convention, see bench/README.md):
//   algbw = size / time;  busbw = algbw * factor, factor by op and n ranks:
//   all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n;
//   broadcast, reduce 1.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace torus::bench {

inline const std::vector<std::string>& all_op_names() {
  static const std::vector<std::string> names = {"all_reduce", "reduce_scatter", "all_gather",
                                                 "all_to_all", "broadcast",      "reduce"};
  return names;
}

// "8", "1K", "1KiB", "256M", "1G" (powers of 1024; "KB"/"MB" are read the
// same). Throws std::invalid_argument.
inline size_t parse_size(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos == 0) throw std::invalid_argument("bad size '" + std::string(text) + "'");
  const size_t value = std::stoull(std::string(text.substr(0, pos)));
  std::string unit(text.substr(pos));
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.empty() || unit == "B") return value;
  const std::string_view prefixes = "KMGT";
  const size_t p = prefixes.find(unit[0]);
  if (p == std::string_view::npos || (unit.size() > 1 && unit.substr(1) != "B" && unit.substr(1) != "IB")) {
    throw std::invalid_argument("bad size unit in '" + std::string(text) + "'");
  }
  return value << (10 * (p + 1));
}

// "512 B", "4 KiB", "256 MiB", "1.5 MiB".
inline std::string human_size(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (v == std::floor(v)) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

// min, min*f, min*f^2, ... up to and including max (nccl-tests -b/-e/-f).
inline std::vector<size_t> size_sweep(size_t min_bytes, size_t max_bytes, double factor) {
  if (min_bytes == 0) throw std::invalid_argument("the smallest size must be > 0");
  if (factor <= 1.0) throw std::invalid_argument("the step factor must be > 1");
  std::vector<size_t> sizes;
  for (double s = static_cast<double>(min_bytes); s <= static_cast<double>(max_bytes) * (1 + 1e-9); s *= factor) {
    sizes.push_back(static_cast<size_t>(std::llround(s)));
  }
  return sizes;
}

inline bool op_splits_per_rank(std::string_view op) {
  return op == "reduce_scatter" || op == "all_gather" || op == "all_to_all";
}

// Elements of the larger per-rank buffer for a requested size (see top).
inline size_t op_count(std::string_view op, size_t bytes, size_t elt, int n) {
  size_t count = std::max<size_t>(bytes / elt, 1);
  if (op_splits_per_rank(op)) count = std::max<size_t>(count / n * n, static_cast<size_t>(n));
  return count;
}

inline double busbw_factor(std::string_view op, int n) {
  if (n <= 1) return op == "broadcast" || op == "reduce" ? 1.0 : 0.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "all_gather" || op == "all_to_all") return static_cast<double>(n - 1) / n;
  return 1.0;  // broadcast, reduce
}

// Timed iterations at one size: `iters`, but no more than fit in
// `budget_bytes` of traffic (size * iterations), and never fewer than 3 —
// large sizes get fewer iterations so a whole sweep stays short.
inline int iterations_for(size_t bytes, int iters, size_t budget_bytes) {
  const size_t fit = budget_bytes / std::max<size_t>(bytes, 1);
  return static_cast<int>(std::max<size_t>(3, std::min<size_t>(static_cast<size_t>(iters), fit)));
}

// Warm-up iterations: `warmup`, cut to a quarter of the budget, at least 1.
inline int warmup_for(size_t bytes, int warmup, size_t budget_bytes) {
  const size_t fit = budget_bytes / 4 / std::max<size_t>(bytes, 1);
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(warmup), fit)));
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace torus::bench
