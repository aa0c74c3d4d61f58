// Same-host peer liveness (src/comm/ofi/liveness.h): what a peer reads from
// a process's provider mark (outside, inside, died inside the provider), its
// inbox count, and the engine declaring its endpoint wedged when a sender
// died inside a send to it (Note [Wedged endpoint], engine.h) instead of
// spinning on the provider's lock.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "comm/ofi/liveness.h"
#include "ofi_world.h"
#include "torus/core/error.h"

namespace torus::comm::ofi::test {
namespace {

using Ms = std::chrono::milliseconds;

// Polls `cond` every millisecond for up to `limit`.
template <typename Cond>
bool eventually(Cond cond, Ms limit = Ms(5000)) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(Ms(1));
  }
  return true;
}

void write_all(int fd, const void* p, size_t n) { require(::write(fd, p, n) == static_cast<ssize_t>(n), "write"); }
void read_all(int fd, void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = ::read(fd, static_cast<char*>(p) + got, n - got);
    require(k > 0, "read");
    got += static_cast<size_t>(k);
  }
}

// Rank 1 owns a mark and does what rank 0 asks ('e'nter, 'l'eave, report
// its 'i'nbox, 'k': enter and die); rank 0 watches it as a peer.
TEST(Liveness, PeersSeeInsideOutsideAndDeathInsideTheProvider) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  auto results = run_ranks(2, [&](int rank) {
    int sock = sv[rank];
    if (rank == 1) {
      ProviderMark mark;
      int32_t hello[2] = {static_cast<int32_t>(::getpid()), mark.shared_fd()};
      write_all(sock, hello, sizeof(hello));
      for (;;) {
        char c;
        read_all(sock, &c, 1);
        if (c == 'e') mark.enter();
        if (c == 'l') mark.leave();
        if (c == 'k') {
          mark.enter();
          ::raise(SIGKILL);
        }
        int32_t reply = c == 'i' ? mark.inbox() : 0;
        write_all(sock, &reply, sizeof(reply));
      }
    }
    int32_t hello[2];
    read_all(sock, hello, sizeof(hello));
    require(hello[1] >= 0, "the mark has no memfd");
    PeerProcess peer(hello[0], hello[1]);
    auto ask = [&](char c) {
      int32_t reply;
      write_all(sock, &c, 1);
      read_all(sock, &reply, sizeof(reply));
      return reply;
    };
    using S = PeerProcess::State;
    require(peer.provider_state() == S::kOutside, "a fresh mark reads as outside");
    require(!peer.exited() && !peer.dying(), "a live peer looks alive");
    ask('e');
    require(peer.provider_state() == S::kInside, "entered: inside");
    ask('l');
    require(peer.provider_state() == S::kOutside, "left: outside");
    require(peer.inbox() != nullptr, "the inbox is mapped");
    {
      InInbox in(peer.inbox());
      require(ask('i') == 1, "the owner sees one sender in its inbox");
    }
    require(ask('i') == 0, "the sender left the inbox");
    char k = 'k';
    write_all(sock, &k, 1);
    require(eventually([&] { return peer.provider_state() == S::kDiedInside; }),
            "death inside the provider is marked");
    require(peer.dying(), "a peer that died inside is dying()");
    require(eventually([&] { return peer.exited(); }), "and eventually exited()");
  });
  ::close(sv[0]);
  ::close(sv[1]);
  EXPECT_TRUE(results[0].exited_ok()) << results[0].output;
  EXPECT_TRUE(WIFSIGNALED(results[1].status)) << "the subject did not die";
}

// The fd of the provider mark memfd of process `pid`, or -1.
int find_mark_fd(pid_t pid) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  int found = -1;
  while (dirent* e = ::readdir(d)) {
    char target[256];
    ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (std::strstr(target, "torus-ofi-provider-mark") != nullptr) found = std::atoi(e->d_name);
  }
  ::closedir(d);
  return found;
}

// World rank 1 plays a sender that died inside a send to rank 0: it counts
// itself in rank 0's inbox and dies. Rank 0 waits for a message of rank 2
// (alive, silent towards that tag): its op must fail with CommError naming
// rank 1 and saying that the endpoint is locked, promptly and not at its
// deadline, and its teardown must not hang. Rank 2's own send to rank 0
// must not get in (rank 0's inbox is up): it fails instead of hanging.
TEST(Liveness, SenderDeadInsideASendWedgesTheEndpointInsteadOfHanging) {
  auto* shared = static_cast<std::atomic<int32_t>*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(shared, MAP_FAILED);
  new (&shared[0]) std::atomic<int32_t>(0);  // rank 0's pid
  new (&shared[1]) std::atomic<int32_t>(0);  // rank 1 is in rank 0's inbox
  auto results = run_job(one_host(3, "shm", false), [&](Backend& b, int rank) {
    if (rank == 1) {
      require(eventually([&] { return shared[0].load() != 0; }), "rank 0 did not publish its pid");
      pid_t pid0 = shared[0].load();
      int fd = find_mark_fd(pid0);
      require(fd >= 0, "no provider mark among rank 0's fds");
      auto* peer = new PeerProcess(pid0, fd);  // both leak: the count stays up
      new InInbox(peer->inbox());
      shared[1].store(1);
      ::raise(SIGKILL);
    }
    if (rank == 2) {
      require(eventually([&] { return shared[1].load() != 0; }), "rank 1 did not get in");
      std::vector<float> y(16, 2.f);
      bool failed = false;
      try {
        b.send(y.data(), y.size(), DType::kF32, 0, 1, Ms(3000))->wait();
      } catch (const Error&) {
        failed = true;
      }
      require(failed, "a send into a wedged endpoint succeeded");
      return;
    }
    shared[0].store(static_cast<int32_t>(::getpid()));
    std::vector<float> x(16);
    auto t0 = std::chrono::steady_clock::now();
    std::string message;
    try {
      b.recv(x.data(), x.size(), DType::kF32, 2, 0, Ms(20000))->wait();
    } catch (const CommError& e) {
      message = e.what();
    }
    auto took = std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - t0);
    require(!message.empty(), "the recv did not fail");
    require(message.find("world rank 1") != std::string::npos && message.find("locked") != std::string::npos,
            "unexpected error: " + message);
    require(took < Ms(5000), "failed only after " + std::to_string(took.count()) + " ms");
  });
  ::munmap(shared, 4096);
  EXPECT_TRUE(results[0].exited_ok()) << results[0].output;
  EXPECT_TRUE(WIFSIGNALED(results[1].status)) << "rank 1 did not die";
  EXPECT_TRUE(results[2].exited_ok()) << results[2].output;
}

}  // namespace
}  // namespace torus::comm::ofi::test
