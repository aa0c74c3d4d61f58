// Failure and ordering behaviour of the ofi backend on forked ranks: a peer
// killed in the middle of a collective (host segment, flat provider,
// hierarchical), ops queued behind a stuck one, destruction with pending
// ops, and point-to-point ops overtaking collectives (no deadlock when ranks
// issue them in different orders).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <thread>

#include "comm/ofi/fabric.h"
#include "ofi_world.h"
#include "torus/core/error.h"

namespace torus::comm::ofi::test {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct KillCase {
  std::string name;
  std::vector<int> host_of;
  std::string provider;
  bool host_shm;
  int victim;
};

class KilledPeer : public testing::TestWithParam<KillCase> {};

// The victim issues a large all_reduce and dies while it is in flight; every
// other rank must fail within the deadline with CommError or TimeoutError
// whose message names the victim's world rank, then tear down promptly.
TEST_P(KilledPeer, OthersFailNamingItAndExitCleanly) {
  const KillCase& k = GetParam();
  JobSpec spec;
  spec.host_of = k.host_of;
  spec.options.provider = k.provider;
  spec.options.host_shm = k.host_shm;
  spec.options.chunk_bytes = 64 << 10;
  spec.timeout = Ms(20000);
  const Ms deadline(8000);
  const std::string victim = "world rank " + std::to_string(k.victim);
  auto results = run_job(spec, [&](Backend& b, int rank) {
    const size_t count = size_t{4} << 20;  // 16 MiB of f32: long enough to be caught in flight
    std::vector<float> x(count, 1.f);
    b.all_reduce(x.data(), x.data(), 1024, DType::kF32, ReduceOp::kSum, Ms(20000))->wait();
    auto t0 = Clock::now();
    std::string message;
    try {
      // A rank still finishing the barrier when the group breaks (the
      // victim leaves it first and dies 5 ms later) fails it instead.
      b.barrier(Ms(20000))->wait();
      WorkPtr w = b.all_reduce(x.data(), x.data(), count, DType::kF32, ReduceOp::kSum, deadline);
      if (rank == k.victim) {
        std::this_thread::sleep_for(Ms(5));
        ::raise(SIGKILL);
      }
      t0 = Clock::now();
      w->wait();
      // The victim may have finished its part before dying; then the op can
      // legitimately succeed here. A second op must fail.
      WorkPtr w2 = b.all_reduce(x.data(), x.data(), count, DType::kF32, ReduceOp::kSum, deadline);
      w2->wait();
      throw std::runtime_error("two all_reduces with a dead peer succeeded");
    } catch (const CommError& e) {
      message = e.what();
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    auto took = std::chrono::duration_cast<Ms>(Clock::now() - t0);
    require(took <= 2 * deadline + Ms(4000), "failed only after " + std::to_string(took.count()) + " ms: " + message);
    require(contains(message, victim) || contains(message, "rank " + std::to_string(k.victim)),
            "the error does not name the dead peer (" + victim + "): " + message);
    // Tearing the backend down must not hang on the dead peer: the body
    // returns, the job harness destroys the backend, the process exits.
  });
  expect_victim_died(results, k.victim);
}

INSTANTIATE_TEST_SUITE_P(
    Ofi, KilledPeer,
    testing::Values(KillCase{"segment", {0, 0, 0}, "shm", true, 2},
                    KillCase{"shm_flat", {0, 0, 0}, "shm", false, 1},
                    KillCase{"tcp_flat", {0, 0, 0}, "tcp", false, 2},
                    KillCase{"hierarchical", {0, 0, 1, 1}, "tcp", true, 3}),
    [](const testing::TestParamInfo<KillCase>& i) { return i.param.name; });

// Rank 0 receives, then joins a collective; rank 1 joins the collective,
// then sends. Point-to-point ops start at once, so neither waits on the
// other's order.
TEST(Ordering, PointToPointDoesNotWaitBehindCollectives) {
  auto results = run_job(one_host(2, "shm"), [](Backend& b, int rank) {
    std::vector<float> x(1000, 1.f), msg(5000, 0.f);
    if (rank == 0) {
      WorkPtr r = b.recv(msg.data(), msg.size(), DType::kF32, 1, 4, Ms(10000));
      b.all_reduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::kSum, Ms(10000))->wait();
      r->wait();
      require(msg[4999] == 7.f, "message content");
    } else {
      b.all_reduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::kSum, Ms(10000))->wait();
      std::fill(msg.begin(), msg.end(), 7.f);
      b.send(msg.data(), msg.size(), DType::kF32, 0, 4, Ms(10000))->wait();
    }
    require(x[0] == 2.f, "all_reduce result");
  });
  expect_all_ok(results);
}

// Many async collectives issued back to back complete in order with the
// right results, driven by the engine thread (nobody waits until the end).
TEST(Ordering, AsyncCollectivesCompleteWithoutWaiting) {
  auto results = run_job(one_host(3, "shm"), [](Backend& b, int rank) {
    std::vector<std::vector<float>> bufs(20, std::vector<float>(3000));
    std::vector<WorkPtr> works;
    for (size_t i = 0; i < bufs.size(); ++i) {
      std::fill(bufs[i].begin(), bufs[i].end(), static_cast<float>(rank + i));
      works.push_back(b.all_reduce(bufs[i].data(), bufs[i].data(), 3000, DType::kF32, ReduceOp::kSum, Ms(10000)));
    }
    auto until = Clock::now() + Ms(10000);
    while (!works.back()->is_completed()) {
      require(Clock::now() < until, "the engine thread did not complete async ops");
      std::this_thread::sleep_for(Ms(1));
    }
    for (size_t i = 0; i < bufs.size(); ++i) {
      require(works[i]->is_completed() && works[i]->succeeded(), "op " + std::to_string(i) + " did not succeed");
      require(bufs[i][2999] == static_cast<float>(3 + 3 * i), "op " + std::to_string(i) + " result");
    }
  });
  expect_all_ok(results);
}

// An op queued behind a stuck one fails at its own (shorter) deadline with a
// TimeoutError saying it never started.
TEST(Deadlines, QueuedOpTimesOutBehindAStuckOne) {
  auto results = run_job(one_host(2, "shm", false), [](Backend& b, int rank) {
    std::vector<float> x(16, 1.f);
    if (rank == 1) {
      std::this_thread::sleep_for(Ms(3000));  // never joins
      return;
    }
    WorkPtr stuck = b.all_reduce(x.data(), x.data(), 16, DType::kF32, ReduceOp::kSum, Ms(2500));
    auto t0 = Clock::now();
    WorkPtr queued = b.barrier(Ms(600));
    std::string m;
    try {
      queued->wait();
    } catch (const TimeoutError& e) {
      m = e.what();
    }
    auto took = std::chrono::duration_cast<Ms>(Clock::now() - t0);
    require(contains(m, "barrier") && contains(m, "not started"), "queued op: " + m);
    require(took >= Ms(550) && took < Ms(2000), "queued op failed after " + std::to_string(took.count()) + " ms");
    try {
      stuck->wait();
      throw std::runtime_error("the stuck op succeeded");
    } catch (const Error& e) {
      // Broken by the queued op's timeout, or its own: either way it failed.
    }
  });
  expect_all_ok(results);
}

// Destroying the last backend of a world with ops pending fails them with
// CommError and does not hang.
TEST(Lifetime, DestroyingTheWorldFailsPendingOps) {
  auto results = run_ranks(1, [](int) {
    ::setenv("FI_TCP_IFACE", "lo", 1);
    TcpStoreServer::Options so;
    so.token = "t";
    TcpStoreServer server(so);
    TcpStore::Options co;
    co.host = "127.0.0.1";
    co.port = server.port();
    co.token = "t";
    auto store = std::make_shared<TcpStore>(co);
    LaunchInfo launch;
    launch.world_size = 2;  // rank 1 never comes: only p2p to it is issued
    HostMap hosts;
    hosts.host_of_rank = {0, 0};
    hosts.hostnames = {"h"};
    // Publish a fake rank 1 address so that creation completes: a second
    // endpoint in this process stands in for it.
    OfiOptions o;
    o.provider = "tcp";
    o.host_shm = false;
    FabricOptions fo;
    fo.provider = "tcp";
    Fabric other(fo);
    const std::vector<uint8_t> blob = endpoint_record(::getpid(), -1, other.provider(), other.address());
    BackendInit init;
    init.launch = &launch;
    init.hosts = &hosts;
    init.store = store;
    init.timeout = Ms(5000);
    std::thread fake([&] {
      // The world's store prefix of the first world made by this process.
      store->set("ofi/w0/addr/1", blob);
    });
    BackendPtr w = create_world_backend(init, o);
    fake.join();
    std::vector<float> x(8);
    WorkPtr r = w->recv(x.data(), 8, DType::kF32, 1, 0, Ms(60000));
    auto t0 = Clock::now();
    w.reset();
    require(Clock::now() - t0 < Ms(3000), "destruction took too long");
    try {
      r->wait();
      throw std::runtime_error("a recv survived its backend");
    } catch (const CommError& e) {
      require(contains(e.what(), "destroyed"), e.what());
    }
  });
  expect_all_ok(results);
}

}  // namespace
}  // namespace torus::comm::ofi::test
