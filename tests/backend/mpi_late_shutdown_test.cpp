// The mpi backend's shutdown when one healthy rank releases its runtime well
// after the others (its own binary: it finalizes MPI). Nothing failed, and
// mpirun runs without recovery, so the early ranks must still finalize MPI
// once the late rank arrives (Note [Finalize after a failure]), and every
// rank must exit with status 0 (checked by mpirun/CTest: a rank that left
// without MPI_Finalize makes mpirun fail the job).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "torus/comm/context.h"

namespace torus::comm {
namespace {

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  return s ? std::atoi(s) : fallback;
}

TEST(MpiShutdown, LateHealthyRankStillFinalizes) {
  LaunchInfo launch;
  launch.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
  launch.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
  BackendInit init;
  init.launch = &launch;
  init.timeout = std::chrono::seconds(60);
  BackendPtr world = create_world_backend("mpi", init);
  world->barrier(std::chrono::seconds(60))->wait();

  // Longer than the runtime's shutdown meeting (10 s).
  const auto late_by = std::chrono::seconds(12);
  const bool late = world->rank() == world->size() - 1;
  if (late) std::this_thread::sleep_for(late_by);
  auto t0 = std::chrono::steady_clock::now();
  world.reset();  // last holder: the runtime meets the others, then finalizes
  auto took = std::chrono::steady_clock::now() - t0;

  int finalized = 0;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 1) << "MPI_Finalize was skipped although no rank failed";
  if (!late && launch.world_size > 1) {
    // It waited for the late rank, as MPI_Finalize does.
    EXPECT_GE(took, late_by - std::chrono::seconds(1));
  }
}

}  // namespace
}  // namespace torus::comm
