// Conformance: split() — membership and ordering by (key, rank), names,
// fresh sequence numbers, ops on the new groups interleaved with ops on the
// parent, nested splits, and color < 0.
#include <algorithm>
#include <thread>

#include "backend_fixture.h"

namespace torus::comm::test {
namespace {

TEST(Split, OddEvenGroupsOrderedByKey) {
  BackendPtr w = world_ptr();
  const int n = w->size(), me = w->rank();
  // key = -rank: the new groups list their members in descending world rank.
  BackendPtr g = w->split(me % 2, -me, "parity", op_timeout());
  ASSERT_NE(g, nullptr);
  std::vector<int> members;
  for (int r = n - 1; r >= 0; --r) {
    if (r % 2 == me % 2) members.push_back(r);
  }
  const int gsize = static_cast<int>(members.size());
  const int grank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  EXPECT_EQ(g->group().name, "parity");
  EXPECT_EQ(g->size(), gsize);
  EXPECT_EQ(g->rank(), grank);
  EXPECT_EQ(g->group().global_ranks, members);
  EXPECT_EQ(g->name(), w->name());

  // all_reduce over the group: sum of (world rank + 1) of its members.
  double want = 0;
  for (int r : members) want += r + 1;
  Buf x(DType::kF32, 7, me + 1);
  WorkPtr first = g->all_reduce(x.data(), x.data(), 7, DType::kF32, ReduceOp::kSum, op_timeout());
  // An op on the parent in between, in flight at the same time.
  Buf y(DType::kI64, 3, 1);
  WorkPtr parent_op = w->all_reduce(y.data(), y.data(), 3, DType::kI64, ReduceOp::kSum, op_timeout());
  wait_ok(first, "all_reduce on 'parity'");
  wait_ok(parent_op, "all_reduce on the parent");
  EXPECT_EQ(first->info().seq, 1u) << "a new group numbers its ops from 1";
  EXPECT_EQ(first->info().group, "parity");
  expect_values(
      x, 0, 7, [&](size_t) { return want; }, "all_reduce on 'parity'");
  expect_values(
      y, 0, 3, [&](size_t) { return static_cast<double>(n); }, "all_reduce on the parent");

  // broadcast from group rank 0 (the highest world rank of the parity).
  Buf v(DType::kBF16, 1031, kSentinel);
  if (grank == 0) {
    for (size_t i = 0; i < 1031; ++i) v.set(i, value(members[0], i));
  }
  wait_ok(g->broadcast(v.data(), 1031, DType::kBF16, 0, op_timeout()), "broadcast on 'parity'");
  expect_values(
      v, 0, 1031, [&](size_t i) { return value(members[0], i); }, "broadcast on 'parity'");

  // send/recv around the group's ring, in group ranks.
  Buf out(DType::kF64, 9, grank), in(DType::kF64, 9, kSentinel);
  WorkPtr r = g->recv(in.data(), 9, DType::kF64, (grank + gsize - 1) % gsize, 0, op_timeout());
  WorkPtr s = g->send(out.data(), 9, DType::kF64, (grank + 1) % gsize, 0, op_timeout());
  wait_ok(s, "send on 'parity'");
  wait_ok(r, "recv on 'parity'");
  expect_values(
      in, 0, 9, [&](size_t) { return static_cast<double>((grank + gsize - 1) % gsize); }, "ring on 'parity'");
  wait_ok(g->barrier(op_timeout()), "barrier on 'parity'");

  // Nested: same color and key everywhere keeps the order of the parent.
  BackendPtr nested = g->split(0, 0, "parity.again", op_timeout());
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->rank(), grank);
  EXPECT_EQ(nested->group().global_ranks, members);
  Buf z(DType::kU8, 4, 1);
  wait_ok(nested->all_reduce(z.data(), z.data(), 4, DType::kU8, ReduceOp::kSum, op_timeout()), "nested all_reduce");
  expect_values(
      z, 0, 4, [&](size_t) { return static_cast<double>(gsize); }, "nested all_reduce");
}

TEST(Split, NegativeColorGivesNoGroup) {
  BackendPtr w = world_ptr();
  const int n = w->size(), me = w->rank();
  BackendPtr g = w->split(me == n - 1 ? -1 : 7, me, "all_but_last", op_timeout());
  if (me == n - 1) {
    EXPECT_EQ(g, nullptr);
  } else {
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->size(), n - 1);
    EXPECT_EQ(g->rank(), me);
    Buf x(DType::kI32, 2, 1);
    wait_ok(g->all_reduce(x.data(), x.data(), 2, DType::kI32, ReduceOp::kSum, op_timeout()), "all_reduce");
    expect_values(
        x, 0, 2, [&](size_t) { return static_cast<double>(n - 1); }, "all_reduce on 'all_but_last'");
  }
  // The parent is still in step.
  wait_ok(w->barrier(op_timeout()), "barrier on the parent");
}

TEST(Split, ManyGroupsCreatedAndDestroyed) {
  BackendPtr w = world_ptr();
  const int me = w->rank();
  for (int k = 0; k < 8; ++k) {
    BackendPtr g = w->split(0, me, "churn" + std::to_string(k), op_timeout());
    ASSERT_NE(g, nullptr);
    Buf x(DType::kF32, 1, 1);
    wait_ok(g->all_reduce(x.data(), x.data(), 1, DType::kF32, ReduceOp::kSum, op_timeout()), "all_reduce");
    expect_values(
        x, 0, 1, [&](size_t) { return static_cast<double>(w->size()); }, "churn all_reduce");
  }
}

TEST(Split, ThreadsDriveSeparateGroups) {
  BackendPtr w = world_ptr();
  const int n = w->size(), me = w->rank();
  BackendPtr a = w->split(0, me, "thread_a", op_timeout());
  BackendPtr b = w->split(0, me, "thread_b", op_timeout());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // Each thread owns one group, so the order of ops per group is the same on
  // every rank while the two groups interleave freely.
  auto drive = [&](Backend& g, int salt) {
    for (int k = 0; k < 40; ++k) {
      Buf x(DType::kI64, 33, me + salt + k);
      wait_ok(g.all_reduce(x.data(), x.data(), 33, DType::kI64, ReduceOp::kSum, op_timeout()), g.group().name);
      double want = static_cast<double>(n) * (salt + k) + n * (n - 1) / 2.0;
      expect_values(
          x, 0, 33, [&](size_t) { return want; }, g.group().name + " op " + std::to_string(k));
    }
  };
  std::thread ta([&] { drive(*a, 1); });
  std::thread tb([&] { drive(*b, 1000); });
  ta.join();
  tb.join();
}

}  // namespace
}  // namespace torus::comm::test
