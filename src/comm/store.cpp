// The client side of the rendezvous store: the Store text helpers,
// PrefixStore, the TcpStore client and generate_job_token.
//
// TcpStore keeps one connection to the server and sends one request at a time
// (a mutex serialises callers). It connects lazily with retries until
// connect_timeout, because rank 0's server may come up after the other ranks,
// and authenticates with the handshake of Note [Store security]. Every
// request has a socket-level deadline (get/wait: their timeout plus a margin;
// the rest: Options::request_timeout), so a dead or hung server produces
// CommError or TimeoutError, never a hang. After a failed request the
// connection is dropped (its state is unknown) and the next request reconnects.
#include <netdb.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <thread>

#include "comm/store_protocol.h"
#include "core/log.h"
#include "torus/comm/store.h"

namespace torus::comm {

namespace proto = store_proto;
using proto::Clock;
using proto::MsgType;

// ---- Store ---------------------------------------------------------------------

void Store::set_string(const std::string& key, const std::string& value) {
  set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string Store::get_string(const std::string& key, Duration timeout) {
  auto v = get(key, timeout);
  return std::string(v.begin(), v.end());
}

// ---- PrefixStore -------------------------------------------------------------------

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  TORUS_CHECK(base_ != nullptr, InvalidArgument, "PrefixStore '{}': the base store is null", prefix_);
}

void PrefixStore::set(const std::string& key, const std::vector<uint8_t>& value) { base_->set(k(key), value); }

std::vector<uint8_t> PrefixStore::get(const std::string& key, Duration timeout) { return base_->get(k(key), timeout); }

int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(k(key), delta); }

void PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(k(key));
  base_->wait(full, timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(k(key));
  return base_->check(full);
}

bool PrefixStore::remove(const std::string& key) { return base_->remove(k(key)); }

// ---- TcpStore ----------------------------------------------------------------------

namespace {

// How long past a get/wait timeout the client waits for the server's
// "timeout" answer before deciding the server itself is gone.
constexpr auto kReplyMargin = std::chrono::seconds(5);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);
constexpr auto kBusyRetry = std::chrono::milliseconds(10);

// A failure worth another connection attempt (refused, reset, closed during
// the handshake). Only an explicit rejection of the token, or a server that
// cannot prove the token, is final.
struct RetryableConnectError {
  std::string why;
};

// The socket-level budget of a get/wait: the server answers "timeout" at
// `timeout`; the margin covers the reply's transfer.
std::chrono::milliseconds reply_budget(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365);
  return std::min(timeout, kForever) + kReplyMargin;
}

proto::Request make_request(MsgType type, std::vector<std::string> keys) {
  proto::Request r;
  r.type = type;
  r.keys = std::move(keys);
  return r;
}

std::string describe(proto::IoResult r, int err) {
  switch (r) {
    case proto::IoResult::kOk: return "ok";
    case proto::IoResult::kClosed: return "the connection was closed by the peer";
    case proto::IoResult::kTimeout: return "timed out";
    case proto::IoResult::kError: return detail::errno_string(err);
  }
  return "?";
}

}  // namespace

struct TcpStore::Impl {
  Options opts;
  std::string endpoint;  // "host:port" for messages
  std::mutex mu;
  proto::Fd fd;  // guarded by mu; invalid when not connected

  void connect(Clock::time_point deadline);
  proto::Fd try_connect(Clock::time_point deadline, std::string* why);
  void handshake(int sock, Clock::time_point deadline);
  // Sends req and returns the reply, within `budget` from when this caller
  // holds the connection (time spent queueing behind other threads is free).
  proto::Reply call(const proto::Request& req, std::chrono::milliseconds budget, const std::string& what);
  void expect_ok(const proto::Reply& r, const std::string& what);
};

TcpStore::TcpStore(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(options);
  const Options& o = impl_->opts;
  TORUS_CHECK(!o.host.empty(), InvalidArgument, "TcpStore: the server host must not be empty");
  TORUS_CHECK(o.port > 0 && o.port <= 65535, InvalidArgument, "TcpStore: port {} is out of range 1..65535",
              o.port);
  TORUS_CHECK(!o.token.empty(), InvalidArgument, "TcpStore: the job token must not be empty");
  bool v6 = o.host.find(':') != std::string::npos && o.host.front() != '[';
  impl_->endpoint = v6 ? fmt::format("[{}]:{}", o.host, o.port) : fmt::format("{}:{}", o.host, o.port);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->connect(proto::deadline_after(o.connect_timeout));
}

TcpStore::~TcpStore() = default;

void TcpStore::Impl::connect(Clock::time_point deadline) {
  auto backoff = std::chrono::milliseconds(10);
  std::string why = "no attempt made";
  int attempts = 0;
  for (;;) {
    ++attempts;
    proto::Fd sock = try_connect(deadline, &why);
    if (sock.valid()) {
      try {
        handshake(sock.get(), deadline);
        fd = std::move(sock);
        TORUS_LOG_DEBUG("store client connected to {} after {} attempt(s)", endpoint, attempts);
        return;
      } catch (const RetryableConnectError& e) {
        why = e.why;
        // The server is up but cut the handshake short (it evicts the oldest
        // unauthenticated connections under a flood): what gets through is
        // a prompt new attempt, not a longer wait.
        backoff = kBusyRetry;
      }
    }
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      throw TimeoutError(fmt::format("store client: could not connect to the store at {} within {} ms ({} attempts; "
                                     "last error: {})",
                                     endpoint, opts.connect_timeout.count(), attempts, why));
    }
    if (attempts == 1 || attempts % 50 == 0) {
      TORUS_LOG_DEBUG("store client: {} not reachable yet ({}); retrying", endpoint, why);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, left));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

// One pass over the addresses of opts.host. Returns an invalid Fd (and sets
// *why) when none accepted the connection.
proto::Fd TcpStore::Impl::try_connect(Clock::time_point deadline, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  std::string host = opts.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), std::to_string(opts.port).c_str(), &hints, &res);
  if (gai != 0) {
    // Name resolution may lag behind (a pod's DNS entry), so this is retried too.
    *why = fmt::format("cannot resolve '{}': {}", opts.host, ::gai_strerror(gai));
    return {};
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    proto::Fd sock(::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock.valid()) {
      *why = "socket: " + detail::errno_string(errno);
      continue;
    }
    int rc = ::connect(sock.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      pollfd p{sock.get(), POLLOUT, 0};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      int prc = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, 60000)));
      int err = 0;
      socklen_t len = sizeof(err);
      if (prc <= 0) {
        err = prc == 0 ? ETIMEDOUT : errno;
      } else if (::getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &err, &len) < 0) {
        err = errno;
      }
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc < 0) {
      *why = fmt::format("connect to {}: {}", proto::sockaddr_to_string(ai->ai_addr), detail::errno_string(errno));
      continue;
    }
    proto::set_stream_options(sock.get());
    return sock;
  }
  return {};
}

void TcpStore::Impl::handshake(int sock, Clock::time_point deadline) {
  // A handshake may use a few seconds even when connect_timeout is nearly spent.
  deadline = std::max(deadline, Clock::now() + std::chrono::seconds(5));
  std::vector<uint8_t> payload;
  int err = 0;
  try {
    proto::IoResult r = proto::read_frame(sock, proto::kMaxHandshakeFrameBytes, deadline, &payload, &err);
    if (r != proto::IoResult::kOk) {
      // Closed before the hello: the server is at its connection limit or
      // still starting; worth another try.
      throw RetryableConnectError{fmt::format("waiting for the server hello: {}", describe(r, err))};
    }
    proto::Nonce server_nonce = proto::decode_server_hello(payload);
    proto::Nonce client_nonce = proto::random_nonce();
    auto auth = proto::encode_client_auth(
        client_nonce, proto::auth_mac(opts.token, proto::Direction::kClient, server_nonce, client_nonce));
    r = proto::write_all(sock, auth.data(), auth.size(), deadline, &err);
    if (r == proto::IoResult::kOk) r = proto::read_frame(sock, proto::kMaxHandshakeFrameBytes, deadline, &payload, &err);
    if (r != proto::IoResult::kOk) {
      // No verdict on the token (a rejection is an explicit frame): the
      // server cut the handshake short, as it does to its oldest
      // unauthenticated connections under a flood, so try again.
      throw RetryableConnectError{fmt::format("the handshake was cut short ({}): the server may be evicting "
                                              "unauthenticated connections",
                                              describe(r, err))};
    }
    proto::Mac server_mac{};
    if (!proto::decode_server_auth(payload, &server_mac)) {
      throw CommError(fmt::format("store authentication failed: the server at {} rejected this job token "
                                  "(is it the token rank 0's server was started with?)",
                                  endpoint));
    }
    if (!proto::mac_equal(server_mac,
                          proto::auth_mac(opts.token, proto::Direction::kServer, server_nonce, client_nonce))) {
      throw CommError(fmt::format("store authentication failed: the server at {} did not prove knowledge of the "
                                  "job token (a different job's store, or an impostor)",
                                  endpoint));
    }
  } catch (const proto::ProtocolError& e) {
    throw CommError(fmt::format("store authentication failed with {}: protocol error: {}", endpoint, e.what()));
  }
}

proto::Reply TcpStore::Impl::call(const proto::Request& req, std::chrono::milliseconds budget,
                                  const std::string& what) {
  auto frame = proto::encode_request(req);
  std::lock_guard<std::mutex> lock(mu);
  if (!fd.valid()) connect(proto::deadline_after(opts.connect_timeout));
  Clock::time_point deadline = proto::deadline_after(budget);
  int err = 0;
  std::vector<uint8_t> payload;
  proto::IoResult r = proto::IoResult::kOk;
  try {
    r = proto::write_all(fd.get(), frame.data(), frame.size(), deadline, &err);
    if (r == proto::IoResult::kOk) r = proto::read_frame(fd.get(), proto::kMaxFrameBytes, deadline, &payload, &err);
    if (r == proto::IoResult::kOk) return proto::decode_reply(req.type, payload);
  } catch (const proto::ProtocolError& e) {
    fd.reset();
    throw CommError(fmt::format("{} on {}: protocol error in the reply: {}", what, endpoint, e.what()));
  }
  fd.reset();  // whatever happened, this connection's state is unknown now
  if (r == proto::IoResult::kTimeout) {
    throw TimeoutError(fmt::format("{}: no reply from the store at {} within {} ms (server hung or unreachable)",
                                   what, endpoint, budget.count()));
  }
  throw CommError(fmt::format("{}: lost the connection to the store at {}: {} (did rank 0 exit?)", what, endpoint,
                              describe(r, err)));
}

void TcpStore::Impl::expect_ok(const proto::Reply& r, const std::string& what) {
  if (r.status == proto::Status::kInvalidArgument) {
    throw InvalidArgument(fmt::format("{} on {}: {}", what, endpoint, r.message));
  }
  if (r.status != proto::Status::kOk) {
    throw CommError(fmt::format("{} on {}: unexpected reply status {}", what, endpoint, static_cast<int>(r.status)));
  }
}

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  proto::validate_key(key);
  TORUS_CHECK(value.size() <= kMaxValueBytes, InvalidArgument,
              "store set {}: value of {} bytes exceeds the limit of {} bytes", proto::printable_key(key),
              value.size(), kMaxValueBytes);
  auto req = make_request(MsgType::kSet, {key});
  req.value = value;
  std::string what = "store set " + proto::printable_key(key);
  impl_->expect_ok(impl_->call(req, impl_->opts.request_timeout, what), what);
}

std::vector<uint8_t> TcpStore::get(const std::string& key, Duration timeout) {
  proto::validate_key(key);
  timeout = std::max(timeout, Duration::zero());
  auto req = make_request(MsgType::kGet, {key});
  req.timeout_ms = static_cast<uint64_t>(timeout.count());
  std::string what = fmt::format("store get {} (timeout {} ms)", proto::printable_key(key), timeout.count());
  proto::Reply r = impl_->call(req, reply_budget(timeout), what);
  if (r.status == proto::Status::kTimeout) {
    throw TimeoutError(fmt::format("store get: key {} was not set within {} ms (store {})", proto::printable_key(key),
                                   timeout.count(), impl_->endpoint));
  }
  impl_->expect_ok(r, what);
  return std::move(r.value);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  proto::validate_key(key);
  auto req = make_request(MsgType::kAdd, {key});
  req.delta = delta;
  std::string what = "store add " + proto::printable_key(key);
  proto::Reply r = impl_->call(req, impl_->opts.request_timeout, what);
  impl_->expect_ok(r, what);
  return r.integer;
}

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  TORUS_CHECK(keys.size() <= proto::kMaxKeysPerRequest, InvalidArgument,
              "store wait: {} keys exceed the limit of {} per request", keys.size(), proto::kMaxKeysPerRequest);
  for (const auto& key : keys) proto::validate_key(key);
  timeout = std::max(timeout, Duration::zero());
  auto req = make_request(MsgType::kWait, keys);
  req.timeout_ms = static_cast<uint64_t>(timeout.count());
  std::string what = fmt::format("store wait for {} (timeout {} ms)", proto::printable_keys(keys), timeout.count());
  proto::Reply r = impl_->call(req, reply_budget(timeout), what);
  if (r.status == proto::Status::kTimeout) {
    const auto& missing = r.missing_keys.empty() ? keys : r.missing_keys;
    throw TimeoutError(fmt::format("store wait: keys {} were not set within {} ms (waited for {} keys; store {})",
                                   proto::printable_keys(missing), timeout.count(), keys.size(), impl_->endpoint));
  }
  impl_->expect_ok(r, what);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  TORUS_CHECK(keys.size() <= proto::kMaxKeysPerRequest, InvalidArgument,
              "store check: {} keys exceed the limit of {} per request", keys.size(), proto::kMaxKeysPerRequest);
  for (const auto& key : keys) proto::validate_key(key);
  auto req = make_request(MsgType::kCheck, keys);
  std::string what = "store check " + proto::printable_keys(keys);
  proto::Reply r = impl_->call(req, impl_->opts.request_timeout, what);
  impl_->expect_ok(r, what);
  return r.flag;
}

bool TcpStore::remove(const std::string& key) {
  proto::validate_key(key);
  auto req = make_request(MsgType::kRemove, {key});
  std::string what = "store remove " + proto::printable_key(key);
  proto::Reply r = impl_->call(req, impl_->opts.request_timeout, what);
  impl_->expect_ok(r, what);
  return r.flag;
}

// ---- tokens ----------------------------------------------------------------------------

std::string generate_job_token() {
  uint8_t bytes[32];
  TORUS_CHECK(RAND_bytes(bytes, sizeof(bytes)) == 1, Error, "generate_job_token: the OpenSSL CSPRNG failed");
  std::string hex;
  hex.reserve(2 * sizeof(bytes));
  for (uint8_t b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace torus::comm
