// Faults on a real GPU, each in its own process (an aborted communicator may
// leave the CUDA context unusable for later tests):
//  * MissingPeer: a two-rank communicator whose second rank never arrives —
//    non-blocking init must give up at its deadline with TimeoutError, the
//    half-made communicator aborted;
//  * StalledOp: an op whose input never becomes ready (the caller's stream
//    is held by a host function) — the watchdog must fail it with
//    TimeoutError at its deadline, abort the communicator, and refuse later
//    ops with CommError.
// Both need only one GPU. Run one test per process (--gtest_filter).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "device/gpu_test_util.h"
#include "nccl/nccl_test_util.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(NcclFault, MissingPeerTimesOutInit) {
  TORUS_REQUIRE_ACCELERATOR();
  NcclInit init;
  init.store = std::make_shared<testing::MemoryStore>();
  init.store_prefix = "fault/missing_peer";
  init.rank = 0;
  init.size = 2;  // rank 1 never comes
  init.device = 0;
  init.timeout = 3s;
  auto start = Clock::now();
  try {
    create_nccl_backend(init);
    FAIL() << "init with a missing peer must time out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("did not complete before the deadline"), std::string::npos) << e.what();
  }
  double took = seconds_since(start);
  EXPECT_GE(took, 2.5);
  EXPECT_LT(took, 30.0) << "aborting the half-made communicator took too long";
}

// Holds a stream until released (a host function may not call CUDA).
void CUDART_CB hold(void* flag) {
  auto* released = static_cast<std::atomic<bool>*>(flag);
  while (!released->load()) std::this_thread::sleep_for(1ms);
}

TEST(NcclFault, StalledOpTimesOutAndAborts) {
  TORUS_REQUIRE_ACCELERATOR();
  testing::Backends world = testing::make_world(1, "fault/stalled");
  NcclBackend& b = *world[0];
  device::Stream s = testing::cuda().create_stream();
  device::StreamGuard guard(s);
  device::DeviceBuffer buf(DeviceType::kCUDA, 4096);
  std::atomic<bool> released{false};
  ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(s.native_handle()), hold, &released), cudaSuccess);
  // Whatever happens, release the stream after 20 s so that the process ends.
  std::thread releaser([&] {
    for (int i = 0; i < 2000 && !released.load(); ++i) std::this_thread::sleep_for(10ms);
    released = true;
  });

  auto start = Clock::now();
  WorkPtr w = b.all_reduce(buf.data(), buf.data(), 1024, DType::kF32, ReduceOp::kSum, 1s);
  try {
    w->wait(60000ms);
    ADD_FAILURE() << "a stalled op must not complete";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce seq 1 on group 'world'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1000 ms"), std::string::npos) << e.what();
  }
  double took = seconds_since(start);
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 10.0) << "the watchdog failed the op only after the stream was released: ncclCommAbort blocked";
  EXPECT_TRUE(b.broken());
  EXPECT_THROW(b.barrier(10s), CommError);
  released = true;
  releaser.join();
  s.synchronize();
  world.clear();  // the aborted communicator is not destroyed
}

}  // namespace
}  // namespace torus::comm
