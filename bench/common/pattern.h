// bench/common/pattern.h — data that makes every collective's result exact.
//
// Each element is a small non-negative integer, so sums over ranks are exact
// in every dtype (f32 holds integers up to 2^24, bf16 up to 256, ...), and a
// result can be compared for equality with a closed-form expectation: #wrong
// is the number of elements that differ. The value depends on the sending
// rank, the receiving rank (all_to_all only) and the element's index, so a
// block delivered to the wrong place is counted as wrong too.
//
//   value(src, dst, i) = (7*src + 5*dst + 3*(i mod M) + 1) mod M
//
// M depends on the dtype and the rank count n, so that n * (M - 1) stays
// exact (modulus_for). Because value depends on i only through i mod M,
// expectations are tables of M entries, and checking costs one lookup per
// element. Header only, standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace torus::bench {

// `exact_limit`: the largest integer the dtype represents exactly and that a
// reduction may reach (255 for u8, 256 for bf16, 2048 for f16, 2^24 for f32).
inline int64_t modulus_for(int64_t exact_limit, int n) {
  return std::clamp<int64_t>(exact_limit / std::max(n, 1), 2, 1021);
}

struct Pattern {
  int64_t m = 1021;

  int64_t value(int src, int dst, size_t i) const {
    return (7 * int64_t{src} + 5 * int64_t{dst} + 3 * static_cast<int64_t>(i % static_cast<size_t>(m)) + 1) % m;
  }

  // table[k] = reduce over src < n of value(src, 0, k), for k < m;
  // `redop`: "sum", "max" or "min".
  std::vector<int64_t> reduced_table(int n, std::string_view redop) const {
    std::vector<int64_t> table(static_cast<size_t>(m));
    for (int64_t k = 0; k < m; ++k) {
      int64_t acc = value(0, 0, static_cast<size_t>(k));
      for (int src = 1; src < n; ++src) {
        const int64_t v = value(src, 0, static_cast<size_t>(k));
        acc = redop == "max" ? std::max(acc, v) : redop == "min" ? std::min(acc, v) : acc + v;
      }
      table[static_cast<size_t>(k)] = acc;
    }
    return table;
  }

  // table[k] = value(src, dst, k), for k < m.
  std::vector<int64_t> table(int src, int dst) const {
    std::vector<int64_t> t(static_cast<size_t>(m));
    for (int64_t k = 0; k < m; ++k) t[static_cast<size_t>(k)] = value(src, dst, static_cast<size_t>(k));
    return t;
  }
};

// Calls fn(i, table[(first + i) mod m]) for i < count, without a division per
// element.
template <class Fn>
void for_each_expected(const std::vector<int64_t>& table, size_t first, size_t count, Fn&& fn) {
  const size_t m = table.size();
  size_t k = first % m;
  for (size_t i = 0; i < count; ++i) {
    fn(i, table[k]);
    if (++k == m) k = 0;
  }
}

}  // namespace torus::bench
