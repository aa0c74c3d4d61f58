// Conformance: send/recv around a ring (every dtype and count; a single rank
// sends to itself), tag matching, and non-overtaking order per tag.
#include "backend_fixture.h"

namespace torus::comm::test {
namespace {

class PointToPoint : public testing::TestWithParam<DType> {};

TEST_P(PointToPoint, Ring) {
  Backend& b = world();
  const DType t = GetParam();
  const int n = b.size(), me = b.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1031}, size_t{1} << 18}) {
    std::string what = "ring " + case_name(t, count, false);
    Buf out(t, count), in(t, count, kSentinel);
    for (size_t i = 0; i < count; ++i) out.set(i, value(me, i));
    WorkPtr r = b.recv(in.data(), count, t, prev, 7, op_timeout());
    WorkPtr s = b.send(out.data(), count, t, next, 7, op_timeout());
    wait_ok(s, what + " send");
    wait_ok(r, what + " recv");
    expect_values(
        in, 0, count, [&](size_t i) { return value(prev, i); }, what);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, PointToPoint, testing::ValuesIn(kAllDTypes), DTypeName());

TEST(PointToPointMisc, TagsSelectMessages) {
  Backend& b = world();
  const int n = b.size(), me = b.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Two messages of different sizes and tags; received in the opposite order.
  Buf a(DType::kI32, 5), c(DType::kI32, 9);
  for (size_t i = 0; i < 5; ++i) a.set(i, 1000 + me * 10 + static_cast<double>(i));
  for (size_t i = 0; i < 9; ++i) c.set(i, 2000 + me * 10 + static_cast<double>(i));
  WorkPtr s1 = b.send(a.data(), 5, DType::kI32, next, 3, op_timeout());
  WorkPtr s2 = b.send(c.data(), 9, DType::kI32, next, 4, op_timeout());
  Buf got_c(DType::kI32, 9, kSentinel), got_a(DType::kI32, 5, kSentinel);
  WorkPtr r2 = b.recv(got_c.data(), 9, DType::kI32, prev, 4, op_timeout());
  WorkPtr r1 = b.recv(got_a.data(), 5, DType::kI32, prev, 3, op_timeout());
  for (auto& w : {r2, r1, s1, s2}) wait_ok(w, w->info().describe());
  expect_values(
      got_a, 0, 5, [&](size_t i) { return 1000 + prev * 10 + static_cast<double>(i); }, "tag 3");
  expect_values(
      got_c, 0, 9, [&](size_t i) { return 2000 + prev * 10 + static_cast<double>(i); }, "tag 4");
}

TEST(PointToPointMisc, SameTagIsNonOvertaking) {
  Backend& b = world();
  const int n = b.size(), me = b.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  constexpr int kMessages = 6;
  constexpr size_t kCount = 257;
  std::vector<Buf> outs, ins;
  std::vector<WorkPtr> works;
  for (int k = 0; k < kMessages; ++k) {
    outs.emplace_back(DType::kF64, kCount, static_cast<double>(k + 1));
    ins.emplace_back(DType::kF64, kCount, kSentinel);
  }
  for (int k = 0; k < kMessages; ++k)
    works.push_back(b.send(outs[k].data(), kCount, DType::kF64, next, 11, op_timeout()));
  for (int k = 0; k < kMessages; ++k)
    works.push_back(b.recv(ins[k].data(), kCount, DType::kF64, prev, 11, op_timeout()));
  for (auto& w : works) wait_ok(w, w->info().describe());
  for (int k = 0; k < kMessages; ++k) {
    expect_values(
        ins[k], 0, kCount, [&](size_t) { return static_cast<double>(k + 1); },
        "message " + std::to_string(k) + " in order");
  }
}

TEST(PointToPointMisc, LargeTagAndSelfSend) {
  Backend& b = world();
  const int me = b.rank();
  // Tags up to 32767 are accepted by every MPI (its guaranteed MPI_TAG_UB).
  Buf out(DType::kU8, 3, 200), in(DType::kU8, 3, 0);
  WorkPtr r = b.recv(in.data(), 3, DType::kU8, me, 32767, op_timeout());
  WorkPtr s = b.send(out.data(), 3, DType::kU8, me, 32767, op_timeout());
  wait_ok(s, "self send");
  wait_ok(r, "self recv");
  expect_values(
      in, 0, 3, [](size_t) { return 200.0; }, "self send/recv");
}

}  // namespace
}  // namespace torus::comm::test
