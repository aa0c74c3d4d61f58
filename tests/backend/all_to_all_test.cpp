// Conformance: all_to_all with equal and uneven splits (counts differing per
// pair of ranks, zeros included), every dtype.
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

INSTANTIATE_TEST_SUITE_P(AllDTypes, AllToAll, testing::ValuesIn(kAllDTypes), DTypeName());

}  // namespace
}  // namespace torus::comm::test
