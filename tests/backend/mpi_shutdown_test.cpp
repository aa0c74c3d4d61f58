// The mpi backend's shutdown (its own binary: it finalizes MPI). Rank 1 skips
// an all_reduce whose deadline is far away; the other ranks then drop every
// backend while the op is in flight. The Work must fail with CommError at
// once, the runtime must finalize MPI without waiting for the abandoned
// request, and every rank must exit with status 0 (checked by mpirun/CTest).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "torus/comm/context.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  return s ? std::atoi(s) : fallback;
}

TEST(MpiShutdown, InFlightOpsFailAndMpiFinalizes) {
  LaunchInfo launch;
  launch.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
  launch.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
  BackendInit init;
  init.launch = &launch;
  init.timeout = std::chrono::seconds(60);
  BackendPtr world = create_world_backend("mpi", init);
  BackendPtr group = world->split(0, world->rank(), "doomed", std::chrono::seconds(60));
  ASSERT_NE(group, nullptr);

  std::vector<float> x(1 << 16, 1.0f);
  WorkPtr pending;
  const bool skipper = world->size() > 1 && world->rank() == 1;
  if (!skipper) {
    pending = group->all_reduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::kSum, std::chrono::minutes(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (world->size() > 1) {
      EXPECT_FALSE(pending->is_completed()) << "completed although rank 1 skipped it";
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  group.reset();
  world.reset();  // last holder: the engine stops and MPI_Finalize runs
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(20)) << "shutdown waited for the abandoned op";
  if (pending && launch.world_size > 1) {
    ASSERT_TRUE(pending->is_completed());
    try {
      pending->wait();
      ADD_FAILURE() << "the in-flight op succeeded";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("shut down"), std::string::npos) << e.what();
    }
  }
  // MPI cannot be initialised twice: a new backend is refused clearly.
  EXPECT_THROW(create_world_backend("mpi", init), CommError);
}

}  // namespace
}  // namespace torus::comm
