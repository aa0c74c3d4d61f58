// The client of torchrun's agent store (src/comm/c10d_agent_store.cpp), as
// the bootstrap gets it through the registered connector, against a c10d
// TCPStore server in this process (what torchrun's agent runs): values cross
// both ways, a missing key is a TimeoutError within its deadline, and an
// endpoint where nothing listens ends in a Torus error, not a hang.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/agent_store.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

TEST(AgentStoreC10d, TalksToATorchrunStyleServer) {
  c10d::TCPStoreOptions server_opts;
  server_opts.port = 0;
  server_opts.isServer = true;
  server_opts.waitWorkers = false;
  server_opts.timeout = 10s;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server_opts);

  auto store = connect_agent_store("127.0.0.1", server->getPort(), 10s);
  store->set_string("torus/run/attempt_0/store", "torus-store-v1 127.0.0.1 4242");
  EXPECT_EQ(server->get("torus/run/attempt_0/store"), bytes("torus-store-v1 127.0.0.1 4242"));
  server->set("from-agent", bytes("hello"));
  EXPECT_EQ(store->get_string("from-agent", 1s), "hello");
  EXPECT_EQ(store->add("n", 2), 2);
  EXPECT_EQ(store->add("n", 3), 5);
  EXPECT_TRUE(store->check({"from-agent", "n"}));
  EXPECT_FALSE(store->check({"absent"}));
  EXPECT_TRUE(store->remove("from-agent"));
  EXPECT_FALSE(store->check({"from-agent"}));

  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(store->get("torus/run/attempt_1/store", 300ms), TimeoutError);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 10s);
}

TEST(AgentStoreC10d, NothingListeningIsAnErrorWithinTheTimeout) {
  // A port that was free a moment ago.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  ::close(fd);

  auto t0 = std::chrono::steady_clock::now();
  try {
    connect_agent_store("127.0.0.1", port, 2s);
    ADD_FAILURE() << "connected to a closed port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("127.0.0.1:{}", port)), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}

}  // namespace
}  // namespace torus::comm
