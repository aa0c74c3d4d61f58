// Rank 0's store server outlives the other ranks' last requests even when the
// job saw a failure. A rank that saw a failed op used to close the server at
// once, so a healthy peer still reading a value rank 0 had written (the last
// step of a split) lost its connection: "store get ...: lost the connection to
// the store ... (did rank 0 exit?)". Its own binary: every rank destroys its
// Context inside the test.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "torus/comm/context.h"

namespace torus::comm {
namespace {

using namespace std::chrono_literals;

TEST(StoreShutdown, FailedRankZeroWaitsForALateReader) {
  auto ctx = Context::create();
  const int rank = ctx->rank();
  ASSERT_GE(ctx->world_size(), 2) << "tests.cmake runs this on 2 and 3 ranks: it needs a late peer";
  std::shared_ptr<Store> store = ctx->store();
  if (rank == 0) store->set("late/value", {42});
  store->add("late/ready", 1);
  while (store->add("late/ready", 0) < ctx->world_size()) std::this_thread::sleep_for(5ms);
  ctx->mark_failed();  // as after a broken group: this job failed
  if (rank != 0) {
    std::this_thread::sleep_for(1500ms);  // rank 0 is destroying its Context meanwhile
    std::vector<uint8_t> v;
    EXPECT_NO_THROW(v = store->get("late/value", 5s)) << "rank 0 closed the store under a live peer";
    EXPECT_EQ(v, std::vector<uint8_t>{42});
    store.reset();
    ctx.reset();
    return;
  }
  store.reset();
  const auto t0 = std::chrono::steady_clock::now();
  ctx.reset();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 1400ms) << "rank 0 did not wait for the late peer";
  EXPECT_LT(took, 10s + 2s) << "bounded, and ended by the peer's check-in";
}

}  // namespace
}  // namespace torus::comm
