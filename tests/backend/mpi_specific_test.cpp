// The mpi backend beyond the common contract: the bootstrap helpers the
// Context uses, the launch cross-check of the world backend, and receive
// size mismatches. Skipped when the suite runs on another backend; compiled
// into builds with the mpi backend only (tests/backend/tests.cmake), since it
// calls the backend's private helpers.
#include <cstdlib>

#include "backend_fixture.h"
#include "comm/mpi/mpi_bootstrap.h"
#include "torus/comm/context.h"
#include "torus/core/error.h"

namespace torus::comm::test {
namespace {

#define SKIP_UNLESS_MPI() \
  if (backend_name() != "mpi") GTEST_SKIP() << "mpi backend only"

TEST(MpiBackend, BootstrapBroadcastReachesEveryRank) {
  SKIP_UNLESS_MPI();
  EXPECT_EQ(mpi_launched(), std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr);
  auto hold = mpi_runtime_hold();
  EXPECT_NE(hold, nullptr);
  const int me = world().rank();
  std::string root_value = "127.0.0.1 29500 " + std::string(5000, 't') + "\n\0end";
  std::string got = mpi_bootstrap_broadcast(me == 0 ? root_value : "ignored on rank " + std::to_string(me));
  EXPECT_EQ(got, root_value);
  EXPECT_EQ(mpi_bootstrap_broadcast(me == 0 ? "" : "x"), "");
}

TEST(MpiBackend, LaunchMismatchIsRejected) {
  SKIP_UNLESS_MPI();
  LaunchInfo wrong;
  wrong.rank = world().rank();
  wrong.world_size = world().size() + 1;
  wrong.source = "test";
  BackendInit init;
  init.launch = &wrong;
  init.timeout = op_timeout();
  EXPECT_THROW(create_world_backend("mpi", init), InvalidArgument);
}

TEST(MpiBackend, RecvOfFewerElementsFails) {
  SKIP_UNLESS_MPI();
  Backend& b = world();
  Buf out(DType::kF32, 5, 3), in(DType::kF32, 7, kSentinel);
  WorkPtr r = b.recv(in.data(), 7, DType::kF32, b.rank(), 21, op_timeout());
  WorkPtr s = b.send(out.data(), 5, DType::kF32, b.rank(), 21, op_timeout());
  wait_ok(s, "send");
  try {
    r->wait();
    ADD_FAILURE() << "a recv of 7 elements accepted a message of 5";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 5 elements, expected 7"), std::string::npos) << e.what();
  }
  // The message was consumed: the group stays usable.
  wait_ok(b.barrier(op_timeout()), "barrier after the short message");
}

TEST(MpiBackend, TruncatedRecvBreaksTheGroup) {
  SKIP_UNLESS_MPI();
  // Open MPI 4.1 truncates a message to oneself silently: use a peer.
  if (world().size() < 2) GTEST_SKIP() << "needs a peer";
  BackendPtr g = world().split(0, world().rank(), "trunc", op_timeout());
  ASSERT_NE(g, nullptr);
  const int n = g->size(), me = g->rank();
  // Every rank's (eager) send completes before any recv breaks a group: an
  // op issued after the break would fail at once without being sent, and
  // its receiver would wait for its deadline.
  Buf out(DType::kI64, 9, 1), in(DType::kI64, 4, kSentinel);
  wait_ok(g->send(out.data(), 9, DType::kI64, (me + 1) % n, 1, op_timeout()), "send of 9 elements");
  WorkPtr r = g->recv(in.data(), 4, DType::kI64, (me + n - 1) % n, 1, op_timeout());
  std::string m = expect_comm_error([&] { return r; }, "truncated recv");
  EXPECT_NE(m.find("TRUNCATE"), std::string::npos) << m;
  expect_comm_error([&] { return g->barrier(op_timeout()); }, "barrier after the error");
  g.reset();
  wait_ok(world().barrier(op_timeout()), "world barrier");
}

}  // namespace
}  // namespace torus::comm::test
