// Conformance: all_to_all with equal and uneven splits (counts differing per
// pair of ranks, zeros included), and groups where some ranks' splits are
// all equal (or all zero) while others' are not; every dtype.
#include "backend_fixture.h"

namespace torus::comm::test {
namespace {

class AllToAll : public testing::TestWithParam<DType> {};

// Element j of the block rank `src` sends to rank `dst`.
double block_value(int src, int dst, size_t j) {
  return static_cast<double>((static_cast<size_t>(src) * 5 + static_cast<size_t>(dst) * 3 + j) % 17 + 1);
}

// Runs one all_to_all where rank s sends count(s, d) elements to rank d.
void run_all_to_all(DType t, const std::function<size_t(int, int)>& count, const std::string& what) {
  Backend& b = world();
  const int n = b.size(), me = b.rank();
  std::vector<size_t> send_counts, recv_counts;
  size_t send_total = 0, recv_total = 0;
  for (int r = 0; r < n; ++r) {
    send_counts.push_back(count(me, r));
    recv_counts.push_back(count(r, me));
    send_total += send_counts.back();
    recv_total += recv_counts.back();
  }
  Buf in(t, send_total);
  size_t off = 0;
  for (int d = 0; d < n; ++d) {
    for (size_t j = 0; j < send_counts[d]; ++j) in.set(off + j, block_value(me, d, j));
    off += send_counts[d];
  }
  Buf out(t, recv_total, kSentinel);
  wait_ok(b.all_to_all(in.data(), out.data(), send_counts, recv_counts, t, op_timeout()), what);
  off = 0;
  for (int s = 0; s < n; ++s) {
    expect_values(
        out, off, recv_counts[s], [&](size_t j) { return block_value(s, me, j); },
        what + " block from rank " + std::to_string(s));
    off += recv_counts[s];
  }
}

TEST_P(AllToAll, EqualSplits) {
  const DType t = GetParam();
  for (size_t c : {size_t{0}, size_t{1}, size_t{7}, size_t{1031}, size_t{1} << 16}) {
    run_all_to_all(
        t, [c](int, int) { return c; }, "all_to_all equal " + case_name(t, c, false));
  }
}

TEST_P(AllToAll, UnevenSplits) {
  const DType t = GetParam();
  for (size_t k : {size_t{1}, size_t{5}, size_t{1031}}) {
    // 0, k or 2k elements depending on the pair; every rank sends k to itself.
    auto count = [k](int s, int d) { return static_cast<size_t>((s + 2 * d + 1) % 3) * k; };
    run_all_to_all(t, count, "all_to_all uneven " + case_name(t, k, false, "scale"));
  }
  // Only rank 0 sends anything (to everybody), a one-sided pattern.
  run_all_to_all(
      t, [](int s, int d) { return s == 0 ? static_cast<size_t>(d + 3) : size_t{0}; },
      "all_to_all from rank 0 only " + std::string(dtype_name(t)));
}

// Some ranks' splits are all equal (all zero: a rank with no tokens to route,
// the normal case of expert parallelism; or all k) while the other ranks'
// splits differ. A backend must not choose its algorithm from its own counts
// alone: every rank has to take part in the same collective.
TEST_P(AllToAll, SomeRanksEqualOthersUneven) {
  const DType t = GetParam();
  const int n = world().size();
  // Ranks `special` send and receive nothing; the others 1..3 elements per
  // pair (uneven: they send 0 to the special ranks and >= 1 to themselves).
  auto silent = [](int special) {
    return [special](int s, int d) {
      return s == special || d == special ? size_t{0} : static_cast<size_t>((s + 2 * d) % 3 + 1);
    };
  };
  // Rank `special` sends k to everybody and receives k from everybody; the
  // others 0, 2 or 4 elements to each other (never k), so they are uneven.
  auto equal_k = [](int special, size_t k) {
    return [special, k](int s, int d) {
      return s == special || d == special ? k : static_cast<size_t>((s + 2 * d) % 3) * 2;
    };
  };
  for (int special : {0, n - 1}) {
    const std::string who = " (rank " + std::to_string(special) + " of " + std::to_string(n) + ") ";
    run_all_to_all(t, silent(special), "all_to_all one rank all-zero" + who + std::string(dtype_name(t)));
    for (size_t k : {size_t{5}, size_t{1031}}) {
      run_all_to_all(t, equal_k(special, k), "all_to_all one rank all-equal" + who + case_name(t, k, false));
    }
  }
  // Only the last rank moves data (to itself); every other rank is idle.
  run_all_to_all(
      t, [n](int s, int d) { return s == n - 1 && d == n - 1 ? size_t{3} : size_t{0}; },
      "all_to_all only the last rank busy " + std::string(dtype_name(t)));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, AllToAll, testing::ValuesIn(kAllDTypes), DTypeName());

}  // namespace
}  // namespace torus::comm::test
