// Note [Store security] under test: mutual authentication (wrong tokens and
// impostor servers rejected, token never on the wire), handshake deadline,
// admission (connection limit, bounds on unauthenticated connections, a
// flood of idle connections that must not delay joining ranks), frame
// validation that never changes a key, and a seeded fuzz storm of hostile
// connections after which the server still serves and every key set before
// it is unchanged.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "store_test_util.h"
#include "torus/core/error.h"

namespace torus::comm::test {
namespace {

// Serves one client as the real server would, but proves `server_token`,
// optionally replacing the server MAC by `forge` (given the client's MAC).
void fake_handshake(int fd, const std::string& server_token, std::vector<uint8_t>* client_bytes,
                    std::function<proto::Mac(const proto::Mac&, const proto::Nonce&, const proto::Nonce&)> forge) {
  int err = 0;
  auto deadline = proto::Clock::now() + 5s;
  proto::Nonce sn = proto::random_nonce();
  auto hello = proto::encode_server_hello(sn);
  proto::write_all(fd, hello.data(), hello.size(), deadline, &err);
  std::vector<uint8_t> payload;
  if (proto::read_frame(fd, proto::kMaxHandshakeFrameBytes, deadline, &payload, &err) != proto::IoResult::kOk) return;
  if (client_bytes) *client_bytes = payload;
  proto::Nonce cn{};
  proto::Mac client_mac{};
  proto::decode_client_auth(payload, &cn, &client_mac);
  proto::Mac mac = forge ? forge(client_mac, sn, cn) : proto::auth_mac(server_token, proto::Direction::kServer, sn, cn);
  auto answer = proto::encode_server_auth(mac);
  proto::write_all(fd, answer.data(), answer.size(), deadline, &err);
  uint8_t b;
  proto::read_exact(fd, &b, 1, proto::Clock::now() + 2s, &err);  // until the client hangs up
}

proto::Request set_request(std::string key, std::string value) {
  proto::Request r;
  r.type = proto::MsgType::kSet;
  r.keys = {std::move(key)};
  r.value = to_bytes(value);
  return r;
}

TcpStore::Options fake_client_options(int port) {
  TcpStore::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = kToken;
  o.connect_timeout = 2s;
  return o;
}

TEST(StoreSecurity, ServerRejectsAWrongTokenAndKeepsServing) {
  TcpStoreServer server(server_options("token-A"));
  TcpStore good(client_options(server, "token-A"));
  good.set_string("k", "v");
  try {
    TcpStore bad(client_options(server, "token-B"));
    FAIL() << "a client with the wrong token connected";
  } catch (const CommError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("store authentication failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find(server.address() + ":" + std::to_string(server.port())), std::string::npos) << msg;
  }
  EXPECT_EQ(server.stats().auth_failures, 1u);
  EXPECT_EQ(good.get_string("k", 1s), "v");
  TcpStore later(client_options(server, "token-A"));
  EXPECT_EQ(later.get_string("k", 1s), "v");
}

TEST(StoreSecurity, ClientRejectsAServerWithAnotherToken) {
  FakeServer fake([](int fd) { fake_handshake(fd, "another-jobs-token", nullptr, nullptr); });
  try {
    TcpStore store(fake_client_options(fake.port()));
    FAIL() << "accepted a server that does not know the token";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("store authentication failed"), std::string::npos) << e.what();
  }
}

TEST(StoreSecurity, ClientRejectsAServerReflectingItsOwnMac) {
  FakeServer fake([](int fd) {
    fake_handshake(fd, "", nullptr, [](const proto::Mac& client_mac, const proto::Nonce&, const proto::Nonce&) {
      return client_mac;
    });
  });
  EXPECT_THROW(TcpStore{fake_client_options(fake.port())}, CommError);
}

TEST(StoreSecurity, FakeServerWithTheRightTokenIsAcceptedAndTokenNeverCrossesTheWire) {
  // The control case for the two tests above, and a look at what the client sent.
  std::vector<uint8_t> client_bytes;
  {
    FakeServer fake([&](int fd) { fake_handshake(fd, kToken, &client_bytes, nullptr); });
    EXPECT_NO_THROW(TcpStore{fake_client_options(fake.port())});
  }
  ASSERT_EQ(client_bytes.size(), 1 + 4 + 1 + proto::kNonceBytes + proto::kMacBytes);
  std::string wire(client_bytes.begin(), client_bytes.end());
  EXPECT_EQ(wire.find(kToken), std::string::npos);
  EXPECT_EQ(wire.find(kToken.substr(0, 8)), std::string::npos);
}

TEST(StoreSecurity, UnauthenticatedConnectionsAreClosedAtTheHandshakeDeadline) {
  auto o = server_options();
  o.handshake_timeout = 200ms;
  TcpStoreServer server(o);
  RawConn silent(server.address(), server.port());
  RawConn slow(server.address(), server.port());
  auto t0 = std::chrono::steady_clock::now();
  // A slow drip of a valid-looking frame does not extend the deadline.
  std::thread drip([&] {
    const uint8_t header[4] = {100, 0, 0, 0};
    if (!slow.send_bytes(header)) return;
    const uint8_t b = static_cast<uint8_t>(proto::MsgType::kClientAuth);
    for (int i = 0; i < 10 && slow.send_bytes({&b, 1}, 100ms); ++i) std::this_thread::sleep_for(50ms);
  });
  EXPECT_TRUE(silent.closed_by_peer_within(3s));
  EXPECT_TRUE(slow.closed_by_peer_within(3s));
  drip.join();
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_EQ(server.stats().handshake_timeouts, 2u);
  TcpStore good(client_options(server));
  EXPECT_EQ(good.add("n", 1), 1);
}

TEST(StoreSecurity, ConnectionLimitEvictsTheUnauthenticatedBeforeRefusing) {
  auto o = server_options();
  o.max_connections = 3;
  TcpStoreServer server(o);
  RawConn a(server.address(), server.port());
  ASSERT_TRUE(a.read_frame(2s, proto::kMaxHandshakeFrameBytes).has_value());  // a holds a slot, idle
  RawConn b(server.address(), server.port());
  RawConn c(server.address(), server.port());
  ASSERT_TRUE(b.handshake(kToken));
  ASSERT_TRUE(c.handshake(kToken));
  // All three slots are taken, one by an idle stranger: a rank still gets in,
  // in the stranger's place.
  auto t0 = std::chrono::steady_clock::now();
  TcpStore good(client_options(server));
  good.set_string("k", "v");
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_TRUE(a.closed_by_peer_within(2s));
  EXPECT_EQ(server.stats().unauthenticated_evicted, 1u);
  EXPECT_EQ(server.stats().connections_refused, 0u);
  // Only when every slot holds an authenticated client is a newcomer refused.
  RawConn d(server.address(), server.port());
  EXPECT_TRUE(d.closed_by_peer_within(2s));
  EXPECT_EQ(server.stats().connections_refused, 1u);
  EXPECT_EQ(server.stats().connections_accepted, 4u);
  EXPECT_EQ(good.get_string("k", 1s), "v");
}

TEST(StoreSecurity, UnauthenticatedConnectionsAreBoundedPerAddressOldestFirst) {
  auto o = server_options();
  o.max_unauthenticated = 8;
  o.max_unauthenticated_per_address = 3;
  TcpStoreServer server(o);
  auto connect = [&] {
    auto c = std::make_unique<RawConn>(server.address(), server.port());
    // Reading the hello makes the arrival order the server's order.
    EXPECT_TRUE(c->read_frame(2s, proto::kMaxHandshakeFrameBytes).has_value());
    return c;
  };
  auto c1 = connect();
  auto c2 = connect();
  auto c3 = connect();
  EXPECT_EQ(server.stats().unauthenticated_evicted, 0u);
  auto c4 = connect();  // the fourth from 127.0.0.1 pushes out the oldest
  EXPECT_TRUE(c1->closed_by_peer_within(2s));
  EXPECT_EQ(server.stats().unauthenticated_evicted, 1u);
  // An authenticated connection leaves the count and is never evicted.
  auto h = [&] {
    auto c = std::make_unique<RawConn>(server.address(), server.port());
    EXPECT_TRUE(c->handshake(kToken));
    return c;
  }();  // that arrival evicted c2; h itself then authenticated
  EXPECT_TRUE(c2->closed_by_peer_within(2s));
  EXPECT_EQ(server.stats().unauthenticated_evicted, 2u);
  auto c5 = connect();  // c3, c4, c5: at the bound, nothing evicted
  EXPECT_EQ(server.stats().unauthenticated_evicted, 2u);
  auto c6 = connect();  // evicts c3
  EXPECT_TRUE(c3->closed_by_peer_within(2s));
  EXPECT_EQ(server.stats().unauthenticated_evicted, 3u);
  for (auto* c : {c4.get(), c5.get(), c6.get()}) EXPECT_FALSE(c->closed_by_peer_within(200ms));
  ASSERT_TRUE(h->send_bytes(proto::encode_request(set_request("h", "still served"))));
  auto reply = h->read_frame(2s);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(proto::decode_reply(proto::MsgType::kSet, *reply).status, proto::Status::kOk);
  EXPECT_EQ(TcpStore(client_options(server)).get_string("h", 1s), "still served");
}

// Frames that must be rejected without touching "victim".
std::vector<std::vector<uint8_t>> bad_frames() {
  std::vector<std::vector<uint8_t>> out;
  auto valid = proto::encode_request(set_request("victim", "evil"));
  // Trailing garbage inside the frame.
  {
    auto f = valid;
    f.push_back(0);
    f[0] = static_cast<uint8_t>(f[0] + 1);
    out.push_back(f);
  }
  // Inner value length larger than the frame.
  {
    auto f = valid;
    f[1 + 4 + 4 + 6] = 0xff;
    out.push_back(f);
  }
  // Key longer than kMaxKeyBytes, declared only.
  out.push_back(std::move(proto::FrameWriter(proto::MsgType::kSet).u32(kMaxKeyBytes + 1)).finish());
  // Value longer than kMaxValueBytes, declared only.
  out.push_back(std::move(proto::FrameWriter(proto::MsgType::kSet).bytes("victim").u32(kMaxValueBytes + 1)).finish());
  // Empty key.
  out.push_back(std::move(proto::FrameWriter(proto::MsgType::kSet).bytes("").bytes("evil")).finish());
  // Too many keys in a wait.
  out.push_back(std::move(proto::FrameWriter(proto::MsgType::kWait).u64(0).u32(proto::kMaxKeysPerRequest + 1)).finish());
  // Unknown command, and a handshake message after the handshake.
  out.push_back(std::move(proto::FrameWriter(static_cast<proto::MsgType>(99)).bytes("victim")).finish());
  out.push_back(proto::encode_client_auth(proto::Nonce{}, proto::Mac{}));
  // Frame length 0, and a length beyond kMaxFrameBytes.
  out.push_back({0, 0, 0, 0});
  out.push_back({0xff, 0xff, 0xff, 0xff, static_cast<uint8_t>(proto::MsgType::kSet)});
  return out;
}

TEST(StoreSecurity, InvalidFramesCloseTheConnectionAndChangeNothing) {
  TcpStoreServer server(server_options());
  TcpStore good(client_options(server));
  good.set_string("victim", "original");
  auto frames = bad_frames();
  for (size_t i = 0; i < frames.size(); ++i) {
    RawConn c(server.address(), server.port());
    ASSERT_TRUE(c.handshake(kToken));
    ASSERT_TRUE(c.send_bytes(frames[i]));
    EXPECT_TRUE(c.closed_by_peer_within(2s)) << "bad frame " << i << " was not rejected";
  }
  EXPECT_EQ(server.stats().protocol_errors, frames.size());
  EXPECT_EQ(good.get_string("victim", 1s), "original");
}

TEST(StoreSecurity, TruncatedFrameThenDisconnectChangesNothing) {
  TcpStoreServer server(server_options());
  TcpStore good(client_options(server));
  good.set_string("victim", "original");
  auto frame = proto::encode_request(set_request("victim", std::string(100000, 'x')));
  for (size_t cut : {size_t{1}, size_t{4}, size_t{5}, size_t{20}, frame.size() / 2, frame.size() - 1}) {
    RawConn c(server.address(), server.port());
    ASSERT_TRUE(c.handshake(kToken));
    ASSERT_TRUE(c.send_bytes({frame.data(), cut}));
    // Disconnect mid-frame, and see the server close its end: by then it has
    // read every byte sent.
    c.shutdown_write();
    EXPECT_TRUE(c.closed_by_peer_within(2s));
  }
  EXPECT_EQ(good.get_string("victim", 1s), "original");
  EXPECT_EQ(server.stats().protocol_errors, 0u);  // an incomplete frame is not an error, just never applied
}

TEST(StoreSecurity, RequestsBeforeAuthenticationAreRejected) {
  TcpStoreServer server(server_options());
  RawConn c(server.address(), server.port());
  ASSERT_TRUE(c.read_frame(2s, proto::kMaxHandshakeFrameBytes).has_value());  // the hello
  ASSERT_TRUE(c.send_bytes(proto::encode_request(set_request("sneaky", "1"))));
  EXPECT_TRUE(c.closed_by_peer_within(2s));
  RawConn big(server.address(), server.port());
  std::vector<uint8_t> huge_header = {0x00, 0x00, 0x10, 0x00};  // 1 MiB: far above the handshake limit
  ASSERT_TRUE(big.send_bytes(huge_header));
  EXPECT_TRUE(big.closed_by_peer_within(2s));
  EXPECT_EQ(server.stats().protocol_errors, 2u);
  EXPECT_FALSE(TcpStore(client_options(server)).check({"sneaky"}));
}

TEST(StoreSecurity, PipelinedRequestsAreAnsweredInOrder) {
  TcpStoreServer server(server_options());
  RawConn c(server.address(), server.port());
  ASSERT_TRUE(c.handshake(kToken));
  proto::Request add;
  add.type = proto::MsgType::kAdd;
  add.keys = {"n"};
  add.delta = 7;
  proto::Request get;
  get.type = proto::MsgType::kGet;
  get.keys = {"a"};
  get.timeout_ms = 1000;
  std::vector<uint8_t> batch;
  for (const auto& r : {set_request("a", "A"), add, get}) {
    auto f = proto::encode_request(r);
    batch.insert(batch.end(), f.begin(), f.end());
  }
  ASSERT_TRUE(c.send_bytes(batch));
  auto r1 = c.read_frame(2s);
  auto r2 = c.read_frame(2s);
  auto r3 = c.read_frame(2s);
  ASSERT_TRUE(r1 && r2 && r3);
  EXPECT_EQ(proto::decode_reply(proto::MsgType::kSet, *r1).status, proto::Status::kOk);
  EXPECT_EQ(proto::decode_reply(proto::MsgType::kAdd, *r2).integer, 7);
  EXPECT_EQ(to_string(proto::decode_reply(proto::MsgType::kGet, *r3).value), "A");
  // And a blocked get holds back the frames behind it until it is answered.
  auto blocked = get;
  blocked.keys = {"later"};
  auto f1 = proto::encode_request(blocked);
  auto f2 = proto::encode_request(add);
  f1.insert(f1.end(), f2.begin(), f2.end());
  ASSERT_TRUE(c.send_bytes(f1));
  TcpStore(client_options(server)).set_string("later", "L");
  auto r4 = c.read_frame(2s);
  auto r5 = c.read_frame(2s);
  ASSERT_TRUE(r4 && r5);
  EXPECT_EQ(to_string(proto::decode_reply(proto::MsgType::kGet, *r4).value), "L");
  EXPECT_EQ(proto::decode_reply(proto::MsgType::kAdd, *r5).integer, 14);
}

// ---- the flood ------------------------------------------------------------------------

// Holds `per_thread` idle connections per thread to a server on 127.0.0.1 and
// opens a new one for every one the server closes: a local user trying to
// keep every slot of the store busy so that no rank can join.
class Flood {
 public:
  Flood(int port, int threads, int per_thread) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this, port, per_thread] { run(port, per_thread); });
  }
  ~Flood() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  uint64_t opened() const { return opened_.load(); }
  uint64_t closed_by_server() const { return closed_.load(); }

 private:
  void run(int port, int target) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::vector<pollfd> fds;
    uint8_t buf[256];
    while (!stop_) {
      while (static_cast<int>(fds.size()) < target && !stop_) {
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) break;
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
          ::close(fd);
          break;
        }
        fds.push_back({fd, POLLIN | POLLRDHUP, 0});
        ++opened_;
      }
      ::poll(fds.data(), fds.size(), 5);
      for (size_t i = 0; i < fds.size();) {
        bool gone = false;
        if (fds[i].revents != 0) {
          ssize_t r = ::recv(fds[i].fd, buf, sizeof(buf), 0);  // the hello, or the end
          gone = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        }
        if (gone) {
          ::close(fds[i].fd);
          ++closed_;
          fds[i] = fds.back();
          fds.pop_back();
        } else {
          fds[i++].revents = 0;
        }
      }
    }
    for (auto& p : fds) ::close(p.fd);
  }

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> opened_{0}, closed_{0};
  std::vector<std::thread> threads_;
};

// The server with the options the bootstrap uses, flooded from loopback by
// more idle connections than it has slots, refilled as fast as it closes
// them; ranks from the same address join meanwhile.
TEST(StoreSecurity, LoopbackFloodDoesNotDelayJoiningClients) {
  constexpr int kFloodThreads = 2, kPerThread = 3000;  // 6000 > the 4096 slots
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 4096 + kFloodThreads * kPerThread + 256) {
    GTEST_SKIP() << "needs " << 4096 + kFloodThreads * kPerThread + 256 << " file descriptors, the limit is "
                 << lim.rlim_cur;
  }
  TcpStoreServer server(server_options());
  Flood flood(server.port(), kFloodThreads, kPerThread);
  auto t_flood = std::chrono::steady_clock::now();
  while (flood.opened() < static_cast<uint64_t>(kFloodThreads * kPerThread) && seconds_since(t_flood) < 20) {
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(300ms);  // let the server fill up

  // Rounds apart, so that the joins sample the flood's steady state over
  // seconds, not just its start.
  constexpr int kRounds = 4, kRanks = 4;
  std::vector<double> latency;
  std::mutex mu;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> ranks;
    for (int r = 0; r < kRanks; ++r) {
      ranks.emplace_back([&] {
        auto o = client_options(server);
        o.connect_timeout = 20s;  // long enough to measure what the flood costs
        auto t0 = std::chrono::steady_clock::now();
        try {
          TcpStore c(o);
          c.add("joined", 1);
          double dt = seconds_since(t0);
          std::lock_guard<std::mutex> lock(mu);
          latency.push_back(dt);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "a client could not join during the flood after " << seconds_since(t0)
                        << " s: " << e.what();
        }
      });
    }
    for (auto& t : ranks) t.join();
    std::this_thread::sleep_for(500ms);
  }
  const uint64_t closed = flood.closed_by_server();
  const double held_s = seconds_since(t_flood);
  std::sort(latency.begin(), latency.end());
  std::printf("flood: %llu connections opened, %llu closed by the server in %.1f s; %zu of %d clients joined, "
              "join latency median %.3f s, max %.3f s\n",
              static_cast<unsigned long long>(flood.opened()), static_cast<unsigned long long>(closed), held_s,
              latency.size(), kRounds * kRanks, latency.empty() ? 0.0 : latency[latency.size() / 2],
              latency.empty() ? 0.0 : latency.back());
  EXPECT_EQ(latency.size(), static_cast<size_t>(kRounds * kRanks));
  for (double dt : latency) EXPECT_LT(dt, 2.0);
  // The server closed the flood's connections rather than the ranks'...
  EXPECT_GT(closed, static_cast<uint64_t>(kFloodThreads * kPerThread - 4096));
  // ...and the server still serves everyone who joined.
  EXPECT_EQ(TcpStore(client_options(server)).add("joined", 0), kRounds * kRanks);
}

// ---- the storm --------------------------------------------------------------------

// Valid requests in the "fuzz/" namespace, the seeds of the mutations. None of
// their bytes spell a "protected/" key, and a few flipped bytes cannot either.
std::vector<std::vector<uint8_t>> seed_frames() {
  std::vector<proto::Request> reqs;
  reqs.push_back(set_request("fuzz/a", "v1"));
  proto::Request r;
  r.type = proto::MsgType::kGet;
  r.keys = {"fuzz/a"};
  reqs.push_back(r);
  r.type = proto::MsgType::kAdd;
  r.keys = {"fuzz/n"};
  r.delta = 3;
  reqs.push_back(r);
  r.type = proto::MsgType::kWait;
  r.keys = {"fuzz/a", "fuzz/b"};
  r.timeout_ms = 0;
  reqs.push_back(r);
  r.type = proto::MsgType::kCheck;
  reqs.push_back(r);
  r.type = proto::MsgType::kRemove;
  r.keys = {"fuzz/b"};
  reqs.push_back(r);
  std::vector<std::vector<uint8_t>> out;
  for (const auto& q : reqs) out.push_back(proto::encode_request(q));
  return out;
}

TEST(StoreFuzz, ServerSurvivesHostileTraffic) {
  auto so = server_options();
  so.handshake_timeout = 1s;
  TcpStoreServer server(so);
  const std::string host = server.address();
  const int port = server.port();
  TcpStore good(client_options(server));

  std::mt19937_64 rng(0x70125);
  std::map<std::string, std::string> protected_kv;
  for (int i = 0; i < 32; ++i) {
    protected_kv["protected/" + std::to_string(i)] = "value-" + std::to_string(rng());
  }
  for (const auto& [k, v] : protected_kv) good.set_string(k, v);

  // A legitimate client keeps working through the storm.
  std::atomic<bool> storm_over{false};
  std::atomic<int> legit_ops{0};
  std::atomic<int> legit_failures{0};
  std::thread legit([&] {
    try {
      TcpStore c(client_options(server));
      for (int i = 0; !storm_over.load(); ++i) {
        std::string key = "legit/" + std::to_string(i % 16);
        c.set_string(key, std::to_string(i));
        if (c.get_string(key, 5s) != std::to_string(i)) ++legit_failures;
        c.add("legit/count", 1);
        ++legit_ops;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "legitimate client failed during the storm: " << e.what();
      ++legit_failures;
    }
  });

  auto random_bytes = [&](size_t n) {
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    return b;
  };
  auto le32 = [](uint32_t v) {
    return std::vector<uint8_t>{uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
  };
  const auto seeds = seed_frames();
  uint64_t certain_protocol_errors = 0;  // cases the server must reject as protocol errors
  uint64_t certain_rejections = 0;       // protocol error or auth failure (random handshake frames)
  uint64_t certain_auth_failures = 0;
  std::vector<std::unique_ptr<RawConn>> lingering;  // left open mid-frame for a while

  constexpr int kMessages = 5000;
  auto t0 = std::chrono::steady_clock::now();
  int sent = 0;
  while (sent < kMessages) {
    auto c = std::make_unique<RawConn>(host, port);
    switch (rng() % 8) {
      case 0: {  // random bytes before authenticating (usually a partial frame)
        c->send_bytes(random_bytes(1 + rng() % 300));
        ++sent;
        break;
      }
      case 1: {  // a declared length above the handshake limit
        uint32_t len = static_cast<uint32_t>(proto::kMaxHandshakeFrameBytes + 1 +
                                             rng() % (UINT32_MAX - proto::kMaxHandshakeFrameBytes));
        auto b = le32(len);
        auto tail = random_bytes(rng() % 64);
        b.insert(b.end(), tail.begin(), tail.end());
        c->send_bytes(b);
        ++sent;
        EXPECT_TRUE(c->closed_by_peer_within(2s));
        ++certain_protocol_errors;
        break;
      }
      case 2: {  // a complete handshake-sized frame of random content
        size_t len = 1 + rng() % proto::kMaxHandshakeFrameBytes;
        auto b = le32(static_cast<uint32_t>(len));
        auto body = random_bytes(len);
        b.insert(b.end(), body.begin(), body.end());
        c->send_bytes(b);
        ++sent;
        EXPECT_TRUE(c->closed_by_peer_within(2s));
        ++certain_rejections;
        break;
      }
      case 3: {  // the wrong token
        EXPECT_FALSE(c->handshake("not-the-token-" + std::to_string(rng())));
        ++sent;
        EXPECT_TRUE(c->closed_by_peer_within(2s));
        ++certain_auth_failures;
        break;
      }
      case 4: {  // authenticated, then random garbage
        ASSERT_TRUE(c->handshake(kToken));
        c->send_bytes(random_bytes(1 + rng() % 200));
        ++sent;
        break;
      }
      case 5: {  // authenticated, then mutated or truncated valid frames
        ASSERT_TRUE(c->handshake(kToken));
        for (int i = 0; i < 5 && sent < kMessages; ++i) {
          auto f = seeds[rng() % seeds.size()];
          int flips = static_cast<int>(rng() % 4);
          for (int j = 0; j < flips; ++j) f[rng() % f.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
          if (rng() % 4 == 0) f.resize(rng() % f.size());
          if (!c->send_bytes(f, 200ms)) break;
          ++sent;
        }
        break;
      }
      case 6: {  // authenticated, then a declared length beyond kMaxFrameBytes
        ASSERT_TRUE(c->handshake(kToken));
        uint32_t len = static_cast<uint32_t>(proto::kMaxFrameBytes + 1 + rng() % (UINT32_MAX - proto::kMaxFrameBytes));
        c->send_bytes(le32(len));
        ++sent;
        EXPECT_TRUE(c->closed_by_peer_within(2s));
        ++certain_protocol_errors;
        break;
      }
      case 7: {  // authenticated, then part of a large frame; disconnect mid-frame later
        ASSERT_TRUE(c->handshake(kToken));
        auto b = le32(static_cast<uint32_t>(1 << 20));
        b.push_back(static_cast<uint8_t>(proto::MsgType::kSet));
        auto body = random_bytes(rng() % 4096);
        b.insert(b.end(), body.begin(), body.end());
        c->send_bytes(b);
        ++sent;
        lingering.push_back(std::move(c));
        if (lingering.size() > 40) lingering.clear();
        break;
      }
    }
  }
  lingering.clear();
  double storm_s = seconds_since(t0);
  storm_over = true;
  legit.join();

  EXPECT_GT(legit_ops.load(), 0);
  EXPECT_EQ(legit_failures.load(), 0);
  for (const auto& [k, v] : protected_kv) EXPECT_EQ(good.get_string(k, 1s), v) << k;
  TcpStore fresh(client_options(server));
  fresh.set_string("after", "storm");
  EXPECT_EQ(fresh.get_string("after", 1s), "storm");
  EXPECT_EQ(fresh.add("legit/count", 0), legit_ops.load());

  auto st = server.stats();
  EXPECT_GE(st.protocol_errors, certain_protocol_errors);
  EXPECT_GE(st.auth_failures, certain_auth_failures);
  EXPECT_GE(st.protocol_errors + st.auth_failures,
            certain_protocol_errors + certain_auth_failures + certain_rejections);
  EXPECT_LT(storm_s, 60.0);
  std::printf("storm: %d messages in %.2f s; server saw %llu connections, %llu protocol errors, %llu auth failures, "
              "%llu handshake timeouts\n",
              sent, storm_s, static_cast<unsigned long long>(st.connections_accepted),
              static_cast<unsigned long long>(st.protocol_errors), static_cast<unsigned long long>(st.auth_failures),
              static_cast<unsigned long long>(st.handshake_timeouts));
}

}  // namespace
}  // namespace torus::comm::test
