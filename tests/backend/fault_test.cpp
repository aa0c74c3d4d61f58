// Conformance: faults. A rank that skips a collective makes the others fail
// with TimeoutError within the deadline plus a margin — naming op, group and
// sequence number — after which the group is broken (CommError) while the
// rest of the job carries on; a receive nobody answers times out; abort()
// fails in-flight ops at once. Each fault happens on a group split off for
// it, and every test ends with a world barrier so that the ranks leave in
// step.
//
// These tests must run last, so that no communicator is created after a
// collective was abandoned (a late message of it could otherwise reach a new
// communicator that reuses the context id on ranks that freed theirs).
// gtest runs plain TESTs first, then value-parameterized suites in link
// order, and this file is linked last: hence a TEST_P suite with one value.
#include "backend_fixture.h"
#include "torus/core/error.h"

namespace torus::comm::test {
namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class Faults : public testing::TestWithParam<const char*> {};

TEST_P(Faults, SkippedCollectiveTimesOutAndBreaksTheGroup) {
  BackendPtr w = world_ptr();
  const int n = w->size(), me = w->rank();
  if (n < 2) GTEST_SKIP() << "needs a second rank to skip the op";
  BackendPtr g = w->split(0, me, "tmo", op_timeout());
  ASSERT_NE(g, nullptr);
  Buf x(DType::kF32, 16, 1);
  // seq 1 works...
  wait_ok(g->all_reduce(x.data(), x.data(), 16, DType::kF32, ReduceOp::kSum, op_timeout()), "warm-up");
  if (me != 1) {
    // ... seq 2 is skipped by rank 1.
    const Duration deadline = fault_timeout();
    auto t0 = Clock::now();
    WorkPtr work = g->all_reduce(x.data(), x.data(), 16, DType::kF32, ReduceOp::kSum, deadline);
    std::string message;
    try {
      work->wait();
      ADD_FAILURE() << "the all_reduce rank 1 skipped completed";
    } catch (const TimeoutError& e) {
      message = e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected TimeoutError, got: " << e.what();
    }
    auto took = std::chrono::duration_cast<Duration>(Clock::now() - t0);
    EXPECT_GE(took, deadline - Duration(50)) << "failed before its deadline";
    EXPECT_LE(took, deadline + fault_margin()) << "reported too late";
    EXPECT_TRUE(contains(message, "all_reduce")) << message;
    EXPECT_TRUE(contains(message, "'tmo'")) << message;
    EXPECT_TRUE(contains(message, "seq 2")) << message;
    EXPECT_TRUE(work->is_completed());
    EXPECT_FALSE(work->succeeded());

    // The group is broken: later ops fail with CommError, at once.
    auto t1 = Clock::now();
    std::string broken = expect_comm_error(
        [&] { return g->all_reduce(x.data(), x.data(), 16, DType::kF32, ReduceOp::kSum, op_timeout()); },
        "all_reduce on the broken group");
    expect_comm_error([&] { return g->barrier(op_timeout()); }, "barrier on the broken group");
    EXPECT_LT(Clock::now() - t1, std::chrono::seconds(2)) << "ops on a broken group must fail at once";
    EXPECT_TRUE(contains(broken, "tmo")) << broken;
  } else {
    g->abort("rank 1 skipped seq 2 on purpose");
  }
  g.reset();
  // The world group is unaffected.
  Buf y(DType::kI32, 3, 1);
  wait_ok(w->all_reduce(y.data(), y.data(), 3, DType::kI32, ReduceOp::kSum, op_timeout()), "world after the fault");
  expect_values(
      y, 0, 3, [&](size_t) { return static_cast<double>(n); }, "world after the fault");
}

TEST_P(Faults, UnansweredRecvTimesOut) {
  BackendPtr w = world_ptr();
  const int n = w->size(), me = w->rank();
  BackendPtr g = w->split(0, me, "p2p_tmo", op_timeout());
  ASSERT_NE(g, nullptr);
  const int peer = (me + 1) % n;
  Buf x(DType::kF64, 8, kSentinel);
  auto t0 = Clock::now();
  WorkPtr r = g->recv(x.data(), 8, DType::kF64, peer, 99, fault_timeout());
  try {
    r->wait();
    ADD_FAILURE() << "a recv nobody answered completed";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_TRUE(contains(m, "recv")) << m;
    EXPECT_TRUE(contains(m, "'p2p_tmo'")) << m;
    EXPECT_TRUE(contains(m, "seq 1")) << m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected TimeoutError, got: " << e.what();
  }
  auto took = std::chrono::duration_cast<Duration>(Clock::now() - t0);
  EXPECT_GE(took, fault_timeout() - Duration(50));
  EXPECT_LE(took, fault_timeout() + fault_margin());
  expect_values(
      x, 0, 8, [](size_t) { return kSentinel; }, "the buffer of the timed-out recv");
  expect_comm_error([&] { return g->send(x.data(), 8, DType::kF64, peer, 99, op_timeout()); }, "send after timeout");
  g.reset();
  wait_ok(w->barrier(op_timeout()), "world barrier");
}

TEST_P(Faults, AbortFailsInFlightOpsAtOnce) {
  BackendPtr w = world_ptr();
  const int n = w->size(), me = w->rank();
  BackendPtr g = w->split(0, me, "aborted", op_timeout());
  ASSERT_NE(g, nullptr);
  Buf x(DType::kI32, 4, 0);
  WorkPtr r = g->recv(x.data(), 4, DType::kI32, (me + n - 1) % n, 5, op_timeout());
  auto t0 = Clock::now();
  g->abort("test abort");
  std::string m = expect_comm_error([&] { return r; }, "recv in flight during abort");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(contains(m, "test abort")) << m;
  EXPECT_NO_THROW(g->abort("again"));  // idempotent
  std::string later = expect_comm_error([&] { return g->barrier(op_timeout()); }, "barrier after abort");
  EXPECT_TRUE(contains(later, "test abort")) << later;
  g.reset();
  wait_ok(w->barrier(op_timeout()), "world barrier");
}

INSTANTIATE_TEST_SUITE_P(AfterAllOtherTests, Faults, testing::Values("last"),
                         [](const testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace torus::comm::test
