// Semantics of the TCP store through its public API: set/get/add/wait/check/
// remove, timeouts, blocking gets, concurrency, PrefixStore, size limits,
// connection lifecycle (late server, dead server, no leaked descriptors) and
// the listening address.
#include <gtest/gtest.h>
#include <ifaddrs.h>

#include <atomic>
#include <filesystem>
#include <limits>
#include <set>
#include <thread>

#include "store_test_util.h"
#include "torus/core/error.h"

namespace torus::comm::test {
namespace {

TEST(Store, SetGetOverwriteAndBinaryValues) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server));
  std::vector<uint8_t> binary = {0, 1, 2, 0xff, 0, 'x'};
  store.set("bin", binary);
  EXPECT_EQ(store.get("bin", 1s), binary);
  store.set("bin", to_bytes("second"));
  EXPECT_EQ(to_string(store.get("bin", 1s)), "second");
  store.set("empty", {});
  EXPECT_TRUE(store.get("empty", 1s).empty());
  store.set_string("text", "hello");
  EXPECT_EQ(store.get_string("text", 1s), "hello");
  // A second client sees the same data.
  TcpStore other(client_options(server));
  EXPECT_EQ(other.get("bin", 1s), to_bytes("second"));
}

TEST(Store, AddSemantics) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server));
  EXPECT_EQ(store.add("n", 5), 5);  // absent counts as 0
  EXPECT_EQ(store.add("n", -8), -3);
  EXPECT_EQ(store.add("n", 0), -3);
  EXPECT_EQ(store.get_string("n", 1s), "-3");  // stored as decimal text
  store.set_string("m", "41");
  EXPECT_EQ(store.add("m", 1), 42);

  store.set_string("word", "abc");
  EXPECT_THROW(store.add("word", 1), InvalidArgument);
  store.set_string("spaced", " 1");
  EXPECT_THROW(store.add("spaced", 1), InvalidArgument);
  store.set_string("max", std::to_string(std::numeric_limits<int64_t>::max()));
  EXPECT_THROW(store.add("max", 1), InvalidArgument);
  // Failed adds change nothing and the connection stays usable.
  EXPECT_EQ(store.get_string("word", 1s), "abc");
  EXPECT_EQ(store.get_string("max", 1s), std::to_string(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(store.add("n", 3), 0);
}

TEST(Store, CheckRemoveAndWait) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server));
  EXPECT_TRUE(store.check({}));
  EXPECT_FALSE(store.check({"a"}));
  store.set_string("a", "1");
  store.set_string("b", "2");
  EXPECT_TRUE(store.check({"a", "b"}));
  EXPECT_FALSE(store.check({"a", "b", "c"}));
  store.wait({"a", "b"}, 1s);  // present: returns at once
  store.wait({}, 1s);
  EXPECT_TRUE(store.remove("a"));
  EXPECT_FALSE(store.remove("a"));
  EXPECT_FALSE(store.check({"a"}));
  EXPECT_TRUE(store.check({"b"}));
  EXPECT_THROW(store.get("a", 0ms), TimeoutError);
}

TEST(Store, GetTimesOutNamingKeyAndTimeout) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server));
  auto t0 = std::chrono::steady_clock::now();
  try {
    store.get("never/set", 300ms);
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    double s = seconds_since(t0);
    EXPECT_GE(s, 0.29);
    EXPECT_LT(s, 1.5);
    std::string msg = e.what();
    EXPECT_NE(msg.find("'never/set'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("300 ms"), std::string::npos) << msg;
  }
  // The connection is still good after a timeout.
  store.set_string("k", "v");
  EXPECT_EQ(store.get_string("k", 1s), "v");
}

TEST(Store, WaitTimesOutNamingTheMissingKeys) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server));
  store.set_string("present", "1");
  auto t0 = std::chrono::steady_clock::now();
  try {
    store.wait({"present", "absent"}, 200ms);
    FAIL() << "wait returned";
  } catch (const TimeoutError& e) {
    double s = seconds_since(t0);
    EXPECT_GE(s, 0.19);
    EXPECT_LT(s, 1.5);
    std::string msg = e.what();
    EXPECT_NE(msg.find("'absent'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("'present'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("200 ms"), std::string::npos) << msg;
  }
}

TEST(Store, GetBlocksUntilAnotherClientSets) {
  TcpStoreServer server(server_options());
  TcpStore setter(client_options(server));
  std::atomic<bool> set_issued{false};
  std::atomic<bool> returned_before_set{false};
  std::string got;
  std::thread getter([&] {
    TcpStore store(client_options(server));
    got = store.get_string("late", 10s);
    if (!set_issued.load()) returned_before_set = true;
  });
  std::this_thread::sleep_for(100ms);  // let the getter block (not needed for correctness)
  set_issued = true;
  setter.set_string("late", "value");
  getter.join();
  EXPECT_EQ(got, "value");
  EXPECT_FALSE(returned_before_set.load());
}

TEST(Store, WaitBlocksUntilEveryKeyIsSet) {
  TcpStoreServer server(server_options());
  TcpStore setter(client_options(server));
  std::atomic<int> keys_set{0};
  std::atomic<int> seen_at_return{-1};
  std::thread waiter([&] {
    TcpStore store(client_options(server));
    store.wait({"k1", "k2", "k3"}, 10s);
    seen_at_return = keys_set.load();
  });
  std::this_thread::sleep_for(50ms);
  for (const char* k : {"k2", "k1"}) {
    setter.set_string(k, "x");
    ++keys_set;
  }
  // Remove and re-set one: the waiter must not be confused by it.
  setter.remove("k1");
  setter.set_string("k1", "again");
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(seen_at_return.load(), -1);  // still waiting for k3
  ++keys_set;
  setter.set_string("k3", "x");
  waiter.join();
  EXPECT_EQ(seen_at_return.load(), 3);
}

TEST(Store, ConcurrentAddsFromManyClientsAreAtomic) {
  TcpStoreServer server(server_options());
  constexpr int kThreads = 16;
  constexpr int kAdds = 100;
  std::vector<std::vector<int64_t>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      TcpStore store(client_options(server));
      for (int i = 0; i < kAdds; ++i) results[t].push_back(store.add("counter", t + 1));
    });
  }
  for (auto& th : threads) th.join();
  // Thread t adds t+1, kAdds times: kAdds * (1 + ... + kThreads).
  const int64_t expected = int64_t{kAdds} * kThreads * (kThreads + 1) / 2;
  TcpStore store(client_options(server));
  EXPECT_EQ(store.add("counter", 0), expected);
  // Every add saw a distinct intermediate total (all deltas are positive).
  std::set<int64_t> distinct;
  for (const auto& r : results) distinct.insert(r.begin(), r.end());
  EXPECT_EQ(distinct.size(), size_t{kThreads} * kAdds);
  EXPECT_EQ(*distinct.rbegin(), expected);
}

TEST(Store, OneClientSharedByThreads) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server));
  constexpr int kThreads = 8;
  constexpr int kIters = 50;
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        std::string key = "t" + std::to_string(t);
        std::string value = std::to_string(t * 1000 + i);
        store.set_string(key, value);
        if (store.get_string(key, 1s) != value) ++mismatches;
        store.add("shared", 1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(store.add("shared", 0), kThreads * kIters);
}

TEST(Store, ManySimultaneousConnections) {
  TcpStoreServer server(server_options());
  constexpr int kClients = 64;
  std::vector<std::unique_ptr<TcpStore>> clients;
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<TcpStore>(client_options(server)));
    keys.push_back("rank/" + std::to_string(i));
  }
  for (int i = 0; i < kClients; ++i) clients[i]->set_string(keys[i], std::to_string(i * i));
  for (int i = 0; i < kClients; ++i) {
    EXPECT_TRUE(clients[i]->check(keys));
    int j = (i * 7 + 3) % kClients;
    EXPECT_EQ(clients[i]->get_string(keys[j], 1s), std::to_string(j * j));
  }
  EXPECT_EQ(server.stats().connections_accepted, uint64_t{kClients});
  EXPECT_EQ(server.stats().auth_failures, 0u);
}

TEST(Store, PrefixStoreIsolation) {
  TcpStoreServer server(server_options());
  auto base = std::make_shared<TcpStore>(client_options(server));
  auto job1 = std::make_shared<PrefixStore>("job1", base);
  PrefixStore job2("job2", base);
  job1->set_string("k", "one");
  EXPECT_FALSE(job2.check({"k"}));
  EXPECT_THROW(job2.get("k", 50ms), TimeoutError);
  EXPECT_THROW(job2.wait({"k"}, 50ms), TimeoutError);
  EXPECT_EQ(base->get_string("job1/k", 1s), "one");
  job1->wait({"k"}, 1s);
  EXPECT_TRUE(job1->check({"k"}));

  EXPECT_EQ(job1->add("n", 5), 5);
  EXPECT_EQ(job2.add("n", 7), 7);
  EXPECT_EQ(job1->add("n", 0), 5);

  PrefixStore inner("inner", job1);
  inner.set_string("x", "deep");
  EXPECT_EQ(base->get_string("job1/inner/x", 1s), "deep");

  EXPECT_FALSE(job2.remove("k"));
  EXPECT_TRUE(base->check({"job1/k"}));
  EXPECT_TRUE(job1->remove("k"));
  EXPECT_FALSE(base->check({"job1/k"}));
  EXPECT_THROW(PrefixStore("p", nullptr), InvalidArgument);
}

TEST(Store, SizeLimitsAreEnforcedAndTheLargestValueRoundTrips) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server));
  EXPECT_THROW(store.set("", {}), InvalidArgument);
  EXPECT_THROW(store.set(std::string(kMaxKeyBytes + 1, 'k'), {}), InvalidArgument);
  EXPECT_THROW(store.get(std::string(kMaxKeyBytes + 1, 'k'), 1s), InvalidArgument);
  EXPECT_THROW(store.wait({"ok", ""}, 1s), InvalidArgument);
  EXPECT_THROW(store.check(std::vector<std::string>(proto::kMaxKeysPerRequest + 1, "k")), InvalidArgument);
  EXPECT_THROW(store.set("big", std::vector<uint8_t>(kMaxValueBytes + 1)), InvalidArgument);
  EXPECT_FALSE(store.check({"big"}));

  std::string long_key(kMaxKeyBytes, 'k');
  store.set_string(long_key, "fits");
  EXPECT_EQ(store.get_string(long_key, 1s), "fits");

  std::vector<uint8_t> largest(kMaxValueBytes);
  for (size_t i = 0; i < largest.size(); ++i) largest[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  store.set("big", largest);
  EXPECT_EQ(store.get("big", 10s), largest);
  EXPECT_EQ(server.stats().protocol_errors, 0u);
}

TEST(Store, OptionsAreValidated) {
  auto o = server_options("");
  EXPECT_THROW(TcpStoreServer{o}, InvalidArgument);
  o = server_options();
  o.bind_addr = "localhost";  // numeric addresses only
  EXPECT_THROW(TcpStoreServer{o}, InvalidArgument);
  o = server_options();
  o.port = 70000;
  EXPECT_THROW(TcpStoreServer{o}, InvalidArgument);

  TcpStoreServer server(server_options());
  auto c = client_options(server, "");
  EXPECT_THROW(TcpStore{c}, InvalidArgument);
  c = client_options(server);
  c.port = 0;
  EXPECT_THROW(TcpStore{c}, InvalidArgument);
}

TEST(Store, ClientWaitsForALateServer) {
  int port = free_port();
  std::string got;
  std::thread client([&] {
    TcpStore::Options o;
    o.host = "127.0.0.1";
    o.port = port;
    o.token = kToken;
    o.connect_timeout = 20s;
    TcpStore store(o);  // retries until the server appears
    got = store.get_string("hello", 5s);
  });
  std::this_thread::sleep_for(300ms);
  auto so = server_options();
  so.port = port;
  TcpStoreServer server(so);
  TcpStore(client_options(server)).set_string("hello", "world");
  client.join();
  EXPECT_EQ(got, "world");
}

TEST(Store, ConnectTimeoutNamesTheEndpoint) {
  int port = free_port();
  TcpStore::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = kToken;
  o.connect_timeout = 300ms;
  auto t0 = std::chrono::steady_clock::now();
  try {
    TcpStore store(o);
    FAIL() << "connected to a port nobody listens on";
  } catch (const TimeoutError& e) {
    EXPECT_LT(seconds_since(t0), 3.0);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST(Store, ServerShutdownFailsBlockedAndLaterRequests) {
  auto server = std::make_unique<TcpStoreServer>(server_options());
  auto o = client_options(*server);
  o.connect_timeout = 300ms;
  TcpStore store(o);
  std::atomic<bool> got_comm_error{false};
  std::atomic<double> blocked_for{0};
  std::thread blocked([&] {
    TcpStore s(o);
    auto t0 = std::chrono::steady_clock::now();
    try {
      s.get("never", 60s);
    } catch (const CommError&) {
      got_comm_error = true;
    }
    blocked_for = seconds_since(t0);
  });
  std::this_thread::sleep_for(200ms);
  server.reset();
  blocked.join();
  EXPECT_TRUE(got_comm_error.load());
  EXPECT_LT(blocked_for.load(), 5.0);
  // The server is gone: a request fails (lost connection, then no server to
  // reconnect to) instead of hanging.
  EXPECT_THROW(store.set_string("k", "v"), CommError);
  EXPECT_THROW(store.set_string("k", "v"), TimeoutError);
}

TEST(Store, HungServerHitsTheRequestDeadline) {
  // Completes the handshake correctly, then never answers.
  std::atomic<bool> done{false};
  FakeServer fake([&](int fd) {
    int err = 0;
    auto deadline = proto::Clock::now() + 5s;
    proto::Nonce sn = proto::random_nonce();
    auto hello = proto::encode_server_hello(sn);
    proto::write_all(fd, hello.data(), hello.size(), deadline, &err);
    std::vector<uint8_t> payload;
    if (proto::read_frame(fd, proto::kMaxHandshakeFrameBytes, deadline, &payload, &err) != proto::IoResult::kOk) return;
    proto::Nonce cn{};
    proto::Mac mac{};
    proto::decode_client_auth(payload, &cn, &mac);
    auto answer = proto::encode_server_auth(proto::auth_mac(kToken, proto::Direction::kServer, sn, cn));
    proto::write_all(fd, answer.data(), answer.size(), deadline, &err);
    while (!done.load()) std::this_thread::sleep_for(10ms);
  });
  TcpStore::Options o;
  o.host = "127.0.0.1";
  o.port = fake.port();
  o.token = kToken;
  o.connect_timeout = 300ms;
  o.request_timeout = 300ms;
  TcpStore store(o);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(store.set_string("k", "v"), TimeoutError);
  double s = seconds_since(t0);
  EXPECT_GE(s, 0.29);
  EXPECT_LT(s, 2.0);
  done = true;
}

size_t open_fd_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST(Store, NoDescriptorsLeakAcrossServerLifetime) {
  size_t before = open_fd_count();
  {
    TcpStoreServer server(server_options());
    std::vector<std::unique_ptr<TcpStore>> clients;
    for (int i = 0; i < 10; ++i) clients.push_back(std::make_unique<TcpStore>(client_options(server)));
    for (auto& c : clients) c->add("n", 1);
    EXPECT_EQ(clients[0]->add("n", 0), 10);
    RawConn idle(server.address(), server.port());  // never authenticates
    EXPECT_GT(open_fd_count(), before + 10);
  }
  EXPECT_EQ(open_fd_count(), before);
}

TEST(Store, Ipv6Loopback) {
  auto o = server_options();
  o.bind_addr = "::1";
  std::unique_ptr<TcpStoreServer> server;
  try {
    server = std::make_unique<TcpStoreServer>(o);
  } catch (const Error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  EXPECT_EQ(server->address(), "::1");
  TcpStore store(client_options(*server));
  store.set_string("v6", "yes");
  EXPECT_EQ(store.get_string("v6", 1s), "yes");
}

TEST(Store, ListensOnlyOnTheBindAddress) {
  TcpStoreServer server(server_options());  // 127.0.0.1
  EXPECT_EQ(server.address(), "127.0.0.1");
  std::string other;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      char buf[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
      if (std::string(buf).rfind("127.", 0) != 0) {
        other = buf;
        break;
      }
    }
    ::freeifaddrs(ifs);
  }
  if (other.empty()) GTEST_SKIP() << "no non-loopback IPv4 interface to test from";
  EXPECT_THROW(RawConn(other, server.port()), std::runtime_error) << "reachable through " << other;
  TcpStore::Options o = client_options(server);
  o.host = other;
  o.connect_timeout = 200ms;
  EXPECT_THROW(TcpStore{o}, TimeoutError);
}

TEST(Store, GenerateJobToken) {
  std::string a = generate_job_token();
  std::string b = generate_job_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace torus::comm::test
