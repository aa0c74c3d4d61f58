// Helpers shared by the store tests: option builders, a raw TCP connection
// that speaks (or deliberately breaks) the wire protocol by hand, and a fake
// server for testing the client's side of the handshake.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/store_protocol.h"
#include "torus/comm/store.h"

namespace torus::comm::test {

namespace proto = store_proto;
using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;

inline const std::string kToken = "0123456789abcdef-test-token";

inline std::vector<uint8_t> to_bytes(std::string_view s) { return {s.begin(), s.end()}; }
inline std::string to_string(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

inline TcpStoreServer::Options server_options(std::string token = kToken) {
  TcpStoreServer::Options o;
  o.bind_addr = "127.0.0.1";
  o.token = std::move(token);
  return o;
}

inline TcpStore::Options client_options(const TcpStoreServer& s, std::string token = kToken) {
  TcpStore::Options o;
  o.host = s.address();
  o.port = s.port();
  o.token = std::move(token);
  o.connect_timeout = 5s;
  o.request_timeout = 10s;
  return o;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A free TCP port on 127.0.0.1 at the time of the call.
inline int free_port() {
  proto::Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw std::runtime_error("bind");
  socklen_t len = sizeof(a);
  ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A hand-driven client connection.
class RawConn {
 public:
  RawConn(const std::string& ipv4, int port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, ipv4.c_str(), &a.sin_addr);
    if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      throw std::runtime_error("RawConn: connect failed");
    }
    proto::set_nonblocking(fd_.get());
  }

  int fd() const { return fd_.get(); }

  // False once the peer has gone.
  bool send_bytes(std::span<const uint8_t> data, Ms timeout = 2s) {
    int err = 0;
    return proto::write_all(fd_.get(), data.data(), data.size(), deadline(timeout), &err) == proto::IoResult::kOk;
  }

  std::optional<std::vector<uint8_t>> read_frame(Ms timeout = 5s, size_t limit = proto::kMaxFrameBytes) {
    std::vector<uint8_t> payload;
    int err = 0;
    if (proto::read_frame(fd_.get(), limit, deadline(timeout), &payload, &err) != proto::IoResult::kOk) {
      return std::nullopt;
    }
    return payload;
  }

  // The client side of the handshake; true when both sides proved the token.
  bool handshake(const std::string& token) {
    auto hello = read_frame(5s, proto::kMaxHandshakeFrameBytes);
    if (!hello) return false;
    proto::Nonce sn = proto::decode_server_hello(*hello);
    proto::Nonce cn = proto::random_nonce();
    auto auth = proto::encode_client_auth(cn, proto::auth_mac(token, proto::Direction::kClient, sn, cn));
    if (!send_bytes(auth)) return false;
    auto answer = read_frame(5s, proto::kMaxHandshakeFrameBytes);
    if (!answer) return false;
    proto::Mac mac{};
    if (!proto::decode_server_auth(*answer, &mac)) return false;
    return proto::mac_equal(mac, proto::auth_mac(token, proto::Direction::kServer, sn, cn));
  }

  // Tells the server no more bytes will come (it sees end of stream).
  void shutdown_write() { ::shutdown(fd_.get(), SHUT_WR); }

  // True when the server closes (or resets) the connection within `timeout`;
  // anything it sends meanwhile is discarded.
  bool closed_by_peer_within(Ms timeout) {
    auto end = deadline(timeout);
    uint8_t buf[4096];
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd_.get(), POLLIN, 0};
      ::poll(&p, 1, 20);
      ssize_t r = ::recv(fd_.get(), buf, sizeof(buf), 0);
      if (r == 0) return true;
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    }
    return false;
  }

 private:
  static proto::Clock::time_point deadline(Ms t) { return proto::Clock::now() + t; }
  proto::Fd fd_;
};

// Listens on 127.0.0.1 and runs `serve` on the first accepted connection in a
// background thread; for testing how the client treats a server.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd)> serve) : listen_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(listen_.get(), 8) != 0) {
      throw std::runtime_error("FakeServer: bind/listen failed");
    }
    socklen_t len = sizeof(a);
    ::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, serve = std::move(serve)] {
      proto::Fd conn(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn.valid()) return;
      proto::set_nonblocking(conn.get());
      serve(conn.get());
    });
  }
  ~FakeServer() {
    ::shutdown(listen_.get(), SHUT_RDWR);  // unblocks accept if no client came
    thread_.join();
  }
  int port() const { return port_; }

 private:
  proto::Fd listen_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace torus::comm::test
