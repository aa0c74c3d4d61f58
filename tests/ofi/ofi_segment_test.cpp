// Unit tests of the host segment's rendezvous and of the ofi options:
// members attach and see each other, a member that never arrives makes the
// creator fail within the timeout, and no shm object is left behind either
// way; stripe sizing and option parsing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "comm/ofi/host_segment.h"
#include "comm/ofi/ofi_options.h"
#include "ofi_test_util.h"
#include "torus/comm/store.h"
#include "torus/core/error.h"

namespace torus::comm::ofi::test {
namespace {

using Ms = std::chrono::milliseconds;

bool shm_object_exists(const std::string& name) {
  return ::access(("/dev/shm" + name).c_str(), F_OK) == 0;
}

// The store in a process of its own: the ranks are forked (Note [Fork with no
// threads], ofi_test_util.h).
struct StoreServer {
  std::shared_ptr<TcpStore> client() const {
    TcpStore::Options o;
    o.host = "127.0.0.1";
    o.port = server.port();
    o.token = "segment-test";
    return std::make_shared<TcpStore>(o);
  }
  StoreServerProcess server{"segment-test"};
};

HostSegment::Config config(const std::string& name, int rank, int size, Ms timeout) {
  HostSegment::Config c;
  c.name = name;
  c.store_key = "seg";
  c.local_rank = rank;
  c.local_size = size;
  c.world_rank = rank;
  c.stripe_bytes = 4096;
  c.depth = 2;
  c.timeout = timeout;
  return c;
}

TEST(HostSegment, MembersAttachSeeEachOtherAndTheNameIsGone) {
  StoreServer server;
  const std::string name = "/torus-ofi-test-" + std::to_string(::getpid()) + "-a";
  auto results = run_ranks(3, [&](int rank) {
    auto store = server.client();
    HostSegment seg(config(name, rank, 3, Ms(10000)), *store);
    // Publish a value in this rank's control block and read the others'.
    seg.control(rank).copied.value.store(100 + static_cast<uint64_t>(rank), std::memory_order_release);
    for (int q = 0; q < 3; ++q) {
      auto until = std::chrono::steady_clock::now() + Ms(5000);
      while (seg.control(q).copied.value.load(std::memory_order_acquire) != 100 + static_cast<uint64_t>(q)) {
        require(std::chrono::steady_clock::now() < until, "never saw local rank " + std::to_string(q));
      }
      require(seg.control(q).pid > 0 && seg.control(q).world_rank == q, "control block of rank " + std::to_string(q));
    }
    require(!shm_object_exists(name), "the shm name still exists after everybody attached");
    require(seg.find_dead_member() < 0, "a live member reported dead");
    // Slots of different ranks and rounds do not overlap.
    require(seg.in_slot(0, 0) != seg.in_slot(1, 0) && seg.in_slot(0, 0) != seg.in_slot(0, 1), "slot layout");
    std::memset(seg.in_slot(rank, 1), rank, 3 * 4096);
    std::memset(seg.out_slot(rank, 1), rank + 10, 4096);
    store->add("written", 1);
    while (store->add("written", 0) < 3) std::this_thread::sleep_for(Ms(1));
    for (int q = 0; q < 3; ++q) {
      require(seg.in_slot(q, 1)[3 * 4096 - 1] == q && seg.out_slot(q, 1)[0] == q + 10, "slot contents");
    }
    store->add("done", 1);
    while (store->add("done", 0) < 3) std::this_thread::sleep_for(Ms(1));
  });
  expect_all_ok(results);
  EXPECT_FALSE(shm_object_exists(name));
}

TEST(HostSegment, MissingMemberTimesOutAndLeavesNothing) {
  StoreServer server;
  const std::string name = "/torus-ofi-test-" + std::to_string(::getpid()) + "-b";
  auto results = run_ranks(1, [&](int) {
    auto store = server.client();
    auto t0 = std::chrono::steady_clock::now();
    try {
      HostSegment seg(config(name, 0, 2, Ms(500)), *store);
    } catch (const TimeoutError& e) {
      auto took = std::chrono::steady_clock::now() - t0;
      require(took < Ms(5000), "took too long");
      require(std::string(e.what()).find("1 of 2") != std::string::npos, e.what());
      return;
    }
    throw std::runtime_error("created a segment without its second member");
  });
  expect_all_ok(results);
  EXPECT_FALSE(shm_object_exists(name));
}

// Ranks whose protocol sizes differ would run different rounds for one op:
// attaching fails on every rank at once, naming the settings.
TEST(HostSegment, MismatchedProtocolSizesFailAtAttach) {
  StoreServer server;
  const std::string name = "/torus-ofi-test-" + std::to_string(::getpid()) + "-p";
  auto results = run_ranks(2, [&](int rank) {
    auto store = server.client();
    HostSegment::Config c = config(name, rank, 2, Ms(20000));
    c.eager_bytes = 16384;
    c.zero_copy_bytes = rank == 0 ? 65536 : 1;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      HostSegment seg(c, *store);
    } catch (const InvalidArgument& e) {
      require(std::chrono::steady_clock::now() - t0 < Ms(5000), "failed only at the deadline");
      require(std::string(e.what()).find("TORUS_OFI_SHM_ZERO_COPY_BYTES") != std::string::npos, e.what());
      return;
    }
    throw std::runtime_error("ranks with different zero-copy sizes attached");
  });
  expect_all_ok(results);
  EXPECT_FALSE(shm_object_exists(name));
}

TEST(HostSegment, AbortWordCarriesTheReason) {
  StoreServer server;
  const std::string name = "/torus-ofi-test-" + std::to_string(::getpid()) + "-c";
  auto results = run_ranks(2, [&](int rank) {
    auto store = server.client();
    HostSegment seg(config(name, rank, 2, Ms(10000)), *store);
    if (rank == 0) seg.mark_aborted(7, "disk on fire");
    store->add("marked", 1);
    while (store->add("marked", 0) < 2) std::this_thread::sleep_for(Ms(1));
    require(seg.is_aborted(), "abort not visible");
    require(seg.aborted() == "world rank 7: disk on fire", "reason: " + seg.aborted());
    seg.mark_aborted(9, "second");  // first reason wins
    require(seg.aborted().find("disk on fire") != std::string::npos, "first reason lost");
    store->add("checked", 1);
    while (store->add("checked", 0) < 2) std::this_thread::sleep_for(Ms(1));
  });
  expect_all_ok(results);
}

TEST(OfiOptions, StripeKeepsStagingWithinBudget) {
  OfiOptions o;
  o.shm_stage_bytes = size_t{2} << 20;
  o.shm_depth = 4;
  for (int l : {2, 3, 4, 8, 64}) {
    size_t s = o.stripe_bytes(l);
    EXPECT_GE(s, 4096u);
    EXPECT_EQ(s & (s - 1), 0u) << "not a power of two: " << s;
    if (s > 4096) {
      EXPECT_LE(s * 4 * static_cast<size_t>(l + 1), o.shm_stage_bytes) << "local size " << l;
    }
  }
  EXPECT_EQ(o.stripe_bytes(2), size_t{128} << 10);
  o.shm_chunk_bytes = 1000;  // explicit: rounded up to whole cache lines
  EXPECT_EQ(o.stripe_bytes(4), 1024u);
}

// The variables are parsed by EnvParams (src/core/params.cpp; its own tests
// are in tests/core); OfiOptions takes them from there.
TEST(OfiOptions, BadValuesNameTheVariable) {
  ::setenv("TORUS_OFI_WINDOW", "0", 1);
  try {
    (void)OfiOptions::from_params(EnvParams::from_env());
    ADD_FAILURE() << "TORUS_OFI_WINDOW=0 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TORUS_OFI_WINDOW"), std::string::npos) << e.what();
  }
  ::unsetenv("TORUS_OFI_WINDOW");
  ::setenv("TORUS_OFI_HOST_SHM", "off", 1);
  EXPECT_FALSE(OfiOptions::from_params(EnvParams::from_env()).host_shm);
  ::unsetenv("TORUS_OFI_HOST_SHM");
  EXPECT_TRUE(OfiOptions::from_params(EnvParams::from_env()).host_shm);
}

TEST(OfiOptions, UnsetVariablesKeepTheDefaults) {
  const OfiOptions defaults;
  EnvParams p;
  OfiOptions o = OfiOptions::from_params(p);
  EXPECT_EQ(o.window, defaults.window);
  EXPECT_EQ(o.inline_spin_us, defaults.inline_spin_us);
  EXPECT_EQ(o.oversubscribed, -1);
  p.ofi.provider = "tcp";
  p.ofi.window = 7;
  p.ofi.inline_spin_us = 0;
  p.ofi.inline_max_bytes = 4096;
  p.ofi.oversubscribed = true;
  p.ofi.shm_zero_copy_bytes = 0;
  o = OfiOptions::from_params(p);
  EXPECT_EQ(o.provider, "tcp");
  EXPECT_EQ(o.window, 7);
  EXPECT_EQ(o.inline_spin_us, 0u);
  EXPECT_EQ(o.inline_max_bytes, 4096u);
  EXPECT_EQ(o.oversubscribed, 1);
  EXPECT_EQ(o.shm_zero_copy_bytes, 0u);
  EXPECT_EQ(o.chunk_bytes, defaults.chunk_bytes);
}

}  // namespace
}  // namespace torus::comm::ofi::test
