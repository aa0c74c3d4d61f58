// Splits of the ofi backend: tag contexts go back to the world when a group
// is destroyed on every member (Note [Recycled contexts]), and a split that
// cannot get a context fails on every member at once with the reason.
#include <gtest/gtest.h>

#include <chrono>

#include "collective_checks.h"
#include "comm/ofi/tags.h"

namespace torus::comm::ofi::test {
namespace {

// More split-and-destroy rounds than there are contexts: each new group
// works, and none runs out.
TEST(OfiSplit, DestroyedGroupsGiveTheirContextsBack) {
  const int rounds = static_cast<int>(kMaxContexts) + 100;
  JobSpec spec = one_host(2, "shm");
  spec.test_deadline = std::chrono::milliseconds(240000);
  expect_all_ok(run_job(spec, [rounds](Backend& world, int rank) {
    for (int i = 0; i < rounds; ++i) {
      // Alternate the key so that group ranks change from round to round.
      std::shared_ptr<Backend> g = world.split(0, (i % 2) ? -rank : rank, "round", kT);
      require(g != nullptr && g->size() == 2, "split " + std::to_string(i) + " gave no group of 2");
      int32_t x = rank + 1 + i;
      g->all_reduce(&x, &x, 1, DType::kI32, ReduceOp::kSum, kT)->wait();
      require(x == 3 + 2 * i, "all_reduce on group " + std::to_string(i) + " gave " + std::to_string(x));
    }
  }));
}

// With all but two contexts taken (the store's counter moved on before the
// job starts), two splits succeed and the third fails on both members at
// once, naming the cause; destroying a group frees its context for the
// next split.
TEST(OfiSplit, ExhaustedContextsFailEveryMemberAtOnce) {
  JobSpec spec = one_host(2, "shm");
  spec.before = [](Store& store) { store.add("ofi/w0/contexts", static_cast<int64_t>(kMaxContexts) - 3); };
  expect_all_ok(run_job(spec, [](Backend& world, int) {
    std::shared_ptr<Backend> a = world.split(0, 0, "a", kT);
    std::shared_ptr<Backend> b = world.split(0, 0, "b", kT);
    require(a != nullptr && b != nullptr, "the last two contexts were not handed out");
    Failure f = failure_of([&] { world.split(0, 0, "c", kT); }, "a split past the last context succeeded");
    require(f.message.find("out of tag contexts") != std::string::npos, "unclear failure: " + f.message);
    require(f.message.find("'c'") != std::string::npos, "the failure does not name the new group: " + f.message);
    require(f.took < std::chrono::seconds(5),
            "the failure took " + std::to_string(f.took.count()) + " ms (waited out a timeout)");
    a.reset();  // on both members: its context is free for the next split
    std::shared_ptr<Backend> d = world.split(0, 0, "d", kT);
    require(d != nullptr, "no group after a context was freed");
    int32_t x = 1;
    d->all_reduce(&x, &x, 1, DType::kI32, ReduceOp::kSum, kT)->wait();
    require(x == 2, "all_reduce on the recycled context gave " + std::to_string(x));
    int32_t y = 5;
    b->all_reduce(&y, &y, 1, DType::kI32, ReduceOp::kMax, kT)->wait();
    require(y == 5, "all_reduce on the surviving group gave " + std::to_string(y));
  }));
}

}  // namespace
}  // namespace torus::comm::ofi::test
