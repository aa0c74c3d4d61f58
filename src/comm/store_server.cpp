// TcpStoreServer: the rendezvous store's server, hosted by rank 0.
//
// One background thread runs a poll() loop over the listening socket, an
// eventfd that wakes it for shutdown, and every connection (non-blocking, with
// its own input and output buffers). A connection goes
//   handshake -> ready            (client proved the token; requests served)
//   handshake -> closing -> dead  (auth rejected: the rejection is flushed)
//   any       -> dead             (protocol error, peer closed, I/O error)
// Bounds that keep a hostile peer from hurting anyone else:
//  * before the handshake completes a connection may buffer at most one
//    kMaxHandshakeFrameBytes frame, and it is closed after handshake_timeout;
//  * unauthenticated connections are bounded in all and per source address,
//    and the oldest of them is closed to admit a new connection at a bound
//    (Admission in store.h). Evicting the oldest rather than refusing the
//    newest is what lets a rank in: a flood's connections are idle, while a
//    rank answers the hello at once, so it authenticates long before enough
//    newer connections arrive to make it the oldest. Each round serves the
//    connections' input before it accepts, so an answer already received is
//    never lost to an eviction in the same round;
//  * an authenticated connection buffers at most one maximal frame, and a new
//    frame is not even read until the previous reply has been sent;
//  * a frame is decoded and validated as a whole before it touches the data,
//    so a truncated or malformed frame never changes a key;
//  * get/wait that must block register on one missing key in a waiter list
//    (no polling) and are answered "timeout" at their deadline.
// Warnings about misbehaving peers are rate limited so that a flood of bad
// connections cannot flood the log.
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "comm/store_protocol.h"
#include "core/log.h"
#include "torus/comm/store.h"

namespace torus::comm {

namespace proto = store_proto;
using proto::Clock;
using proto::MsgType;

namespace {

constexpr size_t kReadChunk = 256 * 1024;
constexpr int kMaxReadsPerWakeup = 16;  // 4 MiB per connection per round: one big sender cannot starve the rest
constexpr int kMaxAcceptsPerWakeup = 256;
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
constexpr size_t kKeepBufferBytes = 1 << 20;  // idle buffers above this are released

// Warn for the first few events of a kind, then at powers of two, so that a
// flood of bad peers leaves a bounded trail in the log.
bool should_warn(uint64_t count) { return count <= 8 || (count & (count - 1)) == 0; }

struct Conn {
  enum class State { kHandshake, kReady, kClosing, kDead };

  uint64_t id = 0;
  proto::Fd fd;
  std::string peer;  // address:port, for log lines
  std::string addr;  // the source address alone: what the per-address bound counts
  State state = State::kHandshake;
  bool authenticated = false;  // counted in Impl::clients_open until closed
  Clock::time_point handshake_deadline;
  proto::Nonce server_nonce{};
  std::vector<uint8_t> in;
  size_t in_off = 0;
  std::vector<uint8_t> out;
  size_t out_off = 0;
  // A get or wait blocked on a missing key: registered in the waiter list of
  // wait_keys[wait_index] only.
  bool waiting = false;
  MsgType wait_type = MsgType::kGet;
  std::vector<std::string> wait_keys;
  size_t wait_index = 0;
  Clock::time_point wait_deadline;

  size_t buffered() const { return in.size() - in_off; }
  bool out_pending() const { return out_off < out.size(); }
  bool alive() const { return state != State::kDead; }
  size_t frame_limit() const {
    return state == State::kHandshake ? proto::kMaxHandshakeFrameBytes : proto::kMaxFrameBytes;
  }
  bool want_read() const {
    return (state == State::kHandshake || state == State::kReady) &&
           buffered() < proto::kFrameHeaderBytes + frame_limit();
  }
};

// Parses a stored integer: optional '-', decimal digits, nothing else.
bool parse_int64(const std::vector<uint8_t>& v, int64_t* out) {
  const char* b = reinterpret_cast<const char*>(v.data());
  const char* e = b + v.size();
  auto [p, ec] = std::from_chars(b, e, *out);
  return !v.empty() && ec == std::errc() && p == e;
}

}  // namespace

struct TcpStoreServer::Impl {
  Options opts;
  std::string address;
  int port = 0;
  std::string endpoint;  // "address:port" for log lines
  proto::Fd listen_fd;
  proto::Fd wake_fd;
  std::thread thread;
  std::atomic<bool> stop{false};

  std::atomic<uint64_t> accepted{0}, refused{0}, auth_failures{0}, protocol_errors{0}, served{0},
      handshake_timeouts{0}, evicted{0};
  std::atomic<uint64_t> clients_open{0};  // authenticated connections not yet closed

  // Everything below belongs to the server thread.
  std::unordered_map<std::string, std::vector<uint8_t>> data;
  std::map<uint64_t, std::unique_ptr<Conn>> conns;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters;  // key -> ids of blocked connections
  std::deque<uint64_t> runnable;  // connections whose buffered frames may now be processed
  size_t live = 0;                // connections not dead (conns also holds dead ones until the round ends)
  // Ids of the connections that have not authenticated (handshake, or closing
  // after a rejection), in all and per source address. Ids grow with arrival,
  // so begin() is the oldest.
  std::set<uint64_t> unauth;
  std::unordered_map<std::string, std::set<uint64_t>> unauth_by_addr;
  uint64_t next_id = 1;
  Clock::time_point accept_paused_until{};
  std::vector<uint8_t> scratch = std::vector<uint8_t>(kReadChunk);

  void run();
  void loop_once();
  void accept_new();
  bool make_room(const std::string& addr, const std::string& peer);
  void evict_oldest(const std::set<uint64_t>& ids, int limit, const char* what);
  void untrack_unauth(Conn& c);
  void handle_events(Conn& c, short revents);
  void read_some(Conn& c);
  void flush(Conn& c);
  void queue(Conn& c, std::vector<uint8_t> bytes);
  void process_frames(Conn& c);
  void on_handshake(Conn& c, std::span<const uint8_t> payload);
  void on_request(Conn& c, std::span<const uint8_t> payload);
  void reply(Conn& c, MsgType type, const proto::Reply& r);
  void do_add(Conn& c, const proto::Request& req);
  void block(Conn& c, proto::Request&& req);
  bool advance_wait(Conn& c);
  void unregister_wait(Conn& c);
  void wake(const std::string& key);
  std::vector<std::string> missing_keys(const std::vector<std::string>& keys) const;
  void expire(Clock::time_point now);
  void drain_runnable();
  void protocol_error(Conn& c, std::string_view why);
  void close_conn(Conn& c);
  void guarded(Conn& c, const char* where, auto&& fn);
};

// ---- lifecycle ---------------------------------------------------------------

TcpStoreServer::TcpStoreServer(Options options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.opts = std::move(options);
  TORUS_CHECK(!s.opts.token.empty(), InvalidArgument, "TcpStoreServer: the job token must not be empty");
  TORUS_CHECK(s.opts.port >= 0 && s.opts.port <= 65535, InvalidArgument, "TcpStoreServer: port {} is out of range",
              s.opts.port);
  TORUS_CHECK(s.opts.max_connections >= 1, InvalidArgument, "TcpStoreServer: max_connections must be >= 1, got {}",
              s.opts.max_connections);
  TORUS_CHECK(s.opts.handshake_timeout.count() > 0, InvalidArgument,
              "TcpStoreServer: handshake_timeout must be positive");
  TORUS_CHECK(s.opts.max_unauthenticated >= 1 && s.opts.max_unauthenticated_per_address >= 1, InvalidArgument,
              "TcpStoreServer: max_unauthenticated ({}) and max_unauthenticated_per_address ({}) must be >= 1",
              s.opts.max_unauthenticated, s.opts.max_unauthenticated_per_address);
  // Each bound is at most the one above it (a small max_connections alone
  // keeps its meaning).
  s.opts.max_unauthenticated = std::min(s.opts.max_unauthenticated, s.opts.max_connections);
  s.opts.max_unauthenticated_per_address =
      std::min(s.opts.max_unauthenticated_per_address, s.opts.max_unauthenticated);

  std::string host = s.opts.bind_addr;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(s.opts.port);
  int gai = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  TORUS_CHECK(gai == 0 && res != nullptr, InvalidArgument,
              "TcpStoreServer: bind_addr '{}' is not a numeric IPv4 or IPv6 address ({})", s.opts.bind_addr,
              ::gai_strerror(gai));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> res_guard(res, &::freeaddrinfo);

  s.listen_fd.reset(::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  TORUS_CHECK_SYS(s.listen_fd.get(), "TcpStoreServer: socket");
  int one = 1;
  TORUS_CHECK_SYS(::setsockopt(s.listen_fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)),
                  "TcpStoreServer: SO_REUSEADDR");
  if (res->ai_family == AF_INET6) {
    // Listen on exactly the address given, never on its IPv4-mapped twin.
    TORUS_CHECK_SYS(::setsockopt(s.listen_fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)),
                    "TcpStoreServer: IPV6_V6ONLY");
  }
  TORUS_CHECK_SYS(::bind(s.listen_fd.get(), res->ai_addr, res->ai_addrlen), "TcpStoreServer: bind {} port {}",
                  s.opts.bind_addr, s.opts.port);
  TORUS_CHECK_SYS(::listen(s.listen_fd.get(), SOMAXCONN), "TcpStoreServer: listen on {}", s.opts.bind_addr);

  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  TORUS_CHECK_SYS(::getsockname(s.listen_fd.get(), reinterpret_cast<sockaddr*>(&bound), &len),
                  "TcpStoreServer: getsockname");
  s.endpoint = proto::sockaddr_to_string(reinterpret_cast<sockaddr*>(&bound));
  char numeric[NI_MAXHOST] = {0};
  TORUS_CHECK(::getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, numeric, sizeof(numeric), nullptr, 0,
                            NI_NUMERICHOST) == 0,
              CommError, "TcpStoreServer: getnameinfo failed for {}", s.endpoint);
  s.address = numeric;
  s.port = bound.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                                      : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);

  s.wake_fd.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  TORUS_CHECK_SYS(s.wake_fd.get(), "TcpStoreServer: eventfd");
  s.thread = std::thread([&s] { s.run(); });
  TORUS_LOG_INFO("store server listening on {}", s.endpoint);
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop.store(true);
  uint64_t one = 1;
  ssize_t w = ::write(impl_->wake_fd.get(), &one, sizeof(one));
  (void)w;  // an eventfd write only fails if the counter would overflow; the flag is set anyway
  if (impl_->thread.joinable()) impl_->thread.join();
  TORUS_LOG_DEBUG("store server on {} stopped", impl_->endpoint);
}

int TcpStoreServer::port() const { return impl_->port; }
const std::string& TcpStoreServer::address() const { return impl_->address; }

TcpStoreServer::Stats TcpStoreServer::stats() const {
  Stats st;
  st.connections_accepted = impl_->accepted.load();
  st.auth_failures = impl_->auth_failures.load();
  st.protocol_errors = impl_->protocol_errors.load();
  st.requests_served = impl_->served.load();
  st.connections_refused = impl_->refused.load();
  st.handshake_timeouts = impl_->handshake_timeouts.load();
  st.unauthenticated_evicted = impl_->evicted.load();
  st.clients_connected = impl_->clients_open.load();
  return st;
}

// ---- the loop ------------------------------------------------------------------

void TcpStoreServer::Impl::run() {
  try {
    while (!stop.load()) loop_once();
  } catch (const std::exception& e) {
    // Only a failure outside any one connection gets here (poll itself).
    TORUS_LOG_ERROR("store server on {} stopped serving: {}", endpoint, e.what());
    listen_fd.reset();
  }
  // Closing every socket makes each client fail fast instead of hanging.
  conns.clear();
}

void TcpStoreServer::Impl::loop_once() {
  std::vector<pollfd> pfds;
  std::vector<Conn*> order;
  pfds.reserve(conns.size() + 2);
  order.reserve(conns.size());
  auto now = Clock::now();
  bool accepting = now >= accept_paused_until;
  Clock::time_point next = now + std::chrono::hours(1);
  if (!accepting) next = accept_paused_until;
  pfds.push_back({wake_fd.get(), POLLIN, 0});
  pfds.push_back({accepting ? listen_fd.get() : -1, POLLIN, 0});  // poll ignores a negative fd
  for (auto& [id, c] : conns) {
    short events = POLLRDHUP;
    if (c->want_read()) events |= POLLIN;
    if (c->out_pending()) events |= POLLOUT;
    pfds.push_back({c->fd.get(), events, 0});
    order.push_back(c.get());
    if (c->state != Conn::State::kReady) next = std::min(next, c->handshake_deadline);
    if (c->waiting) next = std::min(next, c->wait_deadline);
  }
  auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  int rc = ::poll(pfds.data(), pfds.size(), static_cast<int>(std::clamp<int64_t>(wait_ms, 0, 3600 * 1000)));
  if (rc < 0) {
    if (errno == EINTR) return;
    TORUS_CHECK_SYS(rc, "store server {}: poll", endpoint);
  }
  if (pfds[0].revents != 0) {
    uint64_t v;
    while (::read(wake_fd.get(), &v, sizeof(v)) > 0) {
    }
  }
  if (stop.load()) return;
  for (size_t i = 0; i < order.size(); ++i) {
    short re = pfds[i + 2].revents;
    Conn& c = *order[i];
    if (re != 0 && c.alive()) guarded(c, "i/o", [&] { handle_events(c, re); });
  }
  if (pfds[1].revents & POLLIN) accept_new();  // after the input: see the header comment
  expire(Clock::now());
  drain_runnable();
  std::erase_if(conns, [](const auto& kv) { return !kv.second->alive(); });
}

// Runs fn for one connection; a failure there (e.g. out of memory) closes that
// connection only.
void TcpStoreServer::Impl::guarded(Conn& c, const char* where, auto&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    TORUS_LOG_ERROR("store server {}: internal error ({}) on the connection from {}: {}; closing it", endpoint,
                    where, c.peer, e.what());
    close_conn(c);
  }
}

void TcpStoreServer::Impl::accept_new() {
  for (int i = 0; i < kMaxAcceptsPerWakeup; ++i) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = ::accept4(listen_fd.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED) continue;
      // Out of descriptors or memory: the listening socket stays readable, so
      // pause accepting instead of spinning.
      TORUS_LOG_WARN("store server {}: accept failed: {}; pausing accepts for {} ms", endpoint,
                     detail::errno_string(err), kAcceptPause.count());
      accept_paused_until = Clock::now() + kAcceptPause;
      return;
    }
    proto::Fd f(fd);
    std::string peer = proto::sockaddr_to_string(reinterpret_cast<sockaddr*>(&ss));
    std::string addr = proto::sockaddr_host(reinterpret_cast<sockaddr*>(&ss));
    if (!make_room(addr, peer)) continue;  // f closes it
    ++accepted;
    proto::set_stream_options(fd);
    auto c = std::make_unique<Conn>();
    c->id = next_id++;
    c->fd = std::move(f);
    c->peer = std::move(peer);
    c->addr = std::move(addr);
    c->handshake_deadline = Clock::now() + opts.handshake_timeout;
    c->server_nonce = proto::random_nonce();
    TORUS_LOG_DEBUG("store server {}: connection from {}", endpoint, c->peer);
    Conn& ref = *c;
    ++live;
    unauth.insert(ref.id);
    unauth_by_addr[ref.addr].insert(ref.id);
    conns.emplace(ref.id, std::move(c));
    guarded(ref, "hello", [&] { queue(ref, proto::encode_server_hello(ref.server_nonce)); });
  }
}

// Makes room for a new connection from `addr` (Admission in store.h); false
// when every slot is held by an authenticated client.
bool TcpStoreServer::Impl::make_room(const std::string& addr, const std::string& peer) {
  if (auto it = unauth_by_addr.find(addr);
      it != unauth_by_addr.end() && it->second.size() >= static_cast<size_t>(opts.max_unauthenticated_per_address)) {
    evict_oldest(it->second, opts.max_unauthenticated_per_address, "unauthenticated connections per address");
  } else if (unauth.size() >= static_cast<size_t>(opts.max_unauthenticated)) {
    evict_oldest(unauth, opts.max_unauthenticated, "unauthenticated connections");
  }
  if (live < static_cast<size_t>(opts.max_connections)) return true;
  if (!unauth.empty()) {
    evict_oldest(unauth, opts.max_connections, "connections");
    return true;
  }
  uint64_t n = ++refused;
  if (should_warn(n)) {
    TORUS_LOG_WARN("store server {}: refusing the connection from {}: all {} connections are authenticated clients "
                   "({} refused so far)", endpoint, peer, opts.max_connections, n);
  }
  return false;
}

void TcpStoreServer::Impl::evict_oldest(const std::set<uint64_t>& ids, int limit, const char* what) {
  Conn& victim = *conns.at(*ids.begin());  // close_conn below changes ids
  uint64_t n = ++evicted;
  if (should_warn(n)) {
    TORUS_LOG_WARN("store server {}: closing the unauthenticated connection from {} to admit a newer one: the "
                   "limit of {} {} is reached ({} closed so far)", endpoint, victim.peer, limit, what, n);
  }
  close_conn(victim);
}

void TcpStoreServer::Impl::untrack_unauth(Conn& c) {
  if (unauth.erase(c.id) == 0) return;
  auto it = unauth_by_addr.find(c.addr);
  if (it == unauth_by_addr.end()) return;
  it->second.erase(c.id);
  if (it->second.empty()) unauth_by_addr.erase(it);
}

void TcpStoreServer::Impl::handle_events(Conn& c, short re) {
  if (re & POLLOUT) flush(c);
  if (!c.alive()) return;
  if (re & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) {
    if (c.want_read()) {
      read_some(c);  // reads the data, then sees the end of stream
    } else if (re & (POLLRDHUP | POLLHUP | POLLERR)) {
      close_conn(c);
      return;
    }
  }
  if (c.alive()) process_frames(c);
}

void TcpStoreServer::Impl::read_some(Conn& c) {
  for (int i = 0; i < kMaxReadsPerWakeup && c.want_read(); ++i) {
    size_t room = proto::kFrameHeaderBytes + c.frame_limit() - c.buffered();
    size_t n = std::min(room, scratch.size());
    ssize_t r = ::recv(c.fd.get(), scratch.data(), n, 0);
    if (r > 0) {
      c.in.insert(c.in.end(), scratch.data(), scratch.data() + r);
      if (static_cast<size_t>(r) < n) return;  // drained
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (c.state == Conn::State::kHandshake) {
      TORUS_LOG_DEBUG("store server {}: {} disconnected before authenticating", endpoint, c.peer);
    }
    close_conn(c);  // end of stream or a socket error
    return;
  }
}

void TcpStoreServer::Impl::queue(Conn& c, std::vector<uint8_t> bytes) {
  if (!c.out_pending()) {
    c.out = std::move(bytes);
    c.out_off = 0;
  } else {
    c.out.insert(c.out.end(), bytes.begin(), bytes.end());
  }
  flush(c);
}

void TcpStoreServer::Impl::flush(Conn& c) {
  while (c.out_pending()) {
    ssize_t w = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (w > 0) {
      c.out_off += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // POLLOUT resumes it
    close_conn(c);
    return;
  }
  c.out_off = 0;
  c.out.clear();
  if (c.out.capacity() > kKeepBufferBytes) c.out.shrink_to_fit();
  if (c.state == Conn::State::kClosing) {
    close_conn(c);
  } else if (c.buffered() > 0) {
    runnable.push_back(c.id);  // frames that arrived while the reply was in flight
  }
}

// ---- frames ----------------------------------------------------------------------

void TcpStoreServer::Impl::process_frames(Conn& c) {
  while (c.state == Conn::State::kHandshake || c.state == Conn::State::kReady) {
    // One request at a time: the next frame waits for the previous reply.
    if (c.waiting || c.out_pending() || c.buffered() < proto::kFrameHeaderBytes) break;
    uint32_t len = proto::read_frame_length(c.in.data() + c.in_off);
    if (len == 0 || len > c.frame_limit()) {
      protocol_error(c, fmt::format("frame length {} is outside 1..{}", len, c.frame_limit()));
      return;
    }
    if (c.buffered() < proto::kFrameHeaderBytes + len) break;
    std::span<const uint8_t> payload(c.in.data() + c.in_off + proto::kFrameHeaderBytes, len);
    c.in_off += proto::kFrameHeaderBytes + len;  // the buffer is not touched again before the next iteration
    try {
      if (c.state == Conn::State::kHandshake) {
        on_handshake(c, payload);
      } else {
        on_request(c, payload);
      }
    } catch (const proto::ProtocolError& e) {
      protocol_error(c, e.what());
      return;
    }
  }
  if (c.in_off == c.in.size()) {
    c.in.clear();
    c.in_off = 0;
    if (c.in.capacity() > kKeepBufferBytes) c.in.shrink_to_fit();
  } else if (c.in_off > 0 && c.in_off >= c.in.size() / 2) {
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(c.in_off));
    c.in_off = 0;
  }
}

void TcpStoreServer::Impl::on_handshake(Conn& c, std::span<const uint8_t> payload) {
  proto::Nonce client_nonce{};
  proto::Mac mac{};
  proto::decode_client_auth(payload, &client_nonce, &mac);
  if (!proto::mac_equal(mac, proto::auth_mac(opts.token, proto::Direction::kClient, c.server_nonce, client_nonce))) {
    uint64_t n = ++auth_failures;
    if (should_warn(n)) {
      TORUS_LOG_WARN("store server {}: authentication failed for the connection from {} (wrong job token?); "
                     "closing it ({} failures so far)", endpoint, c.peer, n);
    }
    c.state = Conn::State::kClosing;  // closed once the rejection is sent, or at the handshake deadline
    queue(c, proto::encode_auth_rejected());
    return;
  }
  c.state = Conn::State::kReady;
  c.authenticated = true;
  ++clients_open;
  untrack_unauth(c);
  TORUS_LOG_DEBUG("store server {}: {} authenticated", endpoint, c.peer);
  queue(c, proto::encode_server_auth(
               proto::auth_mac(opts.token, proto::Direction::kServer, c.server_nonce, client_nonce)));
}

void TcpStoreServer::Impl::reply(Conn& c, MsgType type, const proto::Reply& r) {
  ++served;
  queue(c, proto::encode_reply(type, r));
}

void TcpStoreServer::Impl::on_request(Conn& c, std::span<const uint8_t> payload) {
  proto::Request req = proto::decode_request(payload);  // whole and valid, or it throws
  proto::Reply r;
  static const std::string kNoKey;
  const std::string& key = req.keys.empty() ? kNoKey : req.keys[0];
  switch (req.type) {
    case MsgType::kSet:
      data[key] = std::move(req.value);
      reply(c, req.type, r);
      wake(key);
      return;
    case MsgType::kGet: {
      auto it = data.find(key);
      if (it == data.end()) return block(c, std::move(req));
      r.value = it->second;
      return reply(c, req.type, r);
    }
    case MsgType::kAdd:
      return do_add(c, req);
    case MsgType::kWait:
      if (!missing_keys(req.keys).empty()) return block(c, std::move(req));
      return reply(c, req.type, r);
    case MsgType::kCheck:
      r.flag = missing_keys(req.keys).empty();
      return reply(c, req.type, r);
    case MsgType::kRemove:
      r.flag = data.erase(key) > 0;
      return reply(c, req.type, r);
    default:
      throw proto::ProtocolError("unexpected request type");  // decode_request admits none
  }
}

void TcpStoreServer::Impl::do_add(Conn& c, const proto::Request& req) {
  const std::string& key = req.keys[0];
  proto::Reply r;
  int64_t current = 0;
  auto it = data.find(key);
  bool existed = it != data.end();
  if (existed && !parse_int64(it->second, &current)) {
    r.status = proto::Status::kInvalidArgument;
    r.message = fmt::format("the value of key {} is not a decimal integer", proto::printable_key(key));
    return reply(c, req.type, r);
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, req.delta, &sum)) {
    r.status = proto::Status::kInvalidArgument;
    r.message = fmt::format("{} + {} overflows int64 (key {})", current, req.delta, proto::printable_key(key));
    return reply(c, req.type, r);
  }
  std::string text = std::to_string(sum);
  data[key].assign(text.begin(), text.end());
  r.integer = sum;
  reply(c, req.type, r);
  if (!existed) wake(key);  // only a new key can satisfy a waiter
}

// ---- blocking get/wait --------------------------------------------------------------

std::vector<std::string> TcpStoreServer::Impl::missing_keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys) {
    if (!data.contains(k)) out.push_back(k);
  }
  return out;
}

void TcpStoreServer::Impl::block(Conn& c, proto::Request&& req) {
  if (req.timeout_ms == 0) {
    proto::Reply r;
    r.status = proto::Status::kTimeout;
    r.missing_keys = missing_keys(req.keys);
    if (r.missing_keys.size() > proto::kMaxReportedKeys) r.missing_keys.resize(proto::kMaxReportedKeys);
    return reply(c, req.type, r);
  }
  c.waiting = true;
  c.wait_type = req.type;
  c.wait_keys = std::move(req.keys);
  c.wait_index = 0;
  c.wait_deadline = proto::deadline_after(std::chrono::milliseconds(
      static_cast<int64_t>(std::min<uint64_t>(req.timeout_ms, uint64_t{1} << 50))));
  if (advance_wait(c)) runnable.push_back(c.id);
}

// Registers c on its next missing key, or answers it when none is missing.
// Returns true when answered.
bool TcpStoreServer::Impl::advance_wait(Conn& c) {
  const auto& keys = c.wait_keys;
  auto first_missing = [&](size_t from) {
    for (size_t i = from; i < keys.size(); ++i) {
      if (!data.contains(keys[i])) return i;
    }
    return keys.size();
  };
  size_t i = first_missing(c.wait_index);
  if (i == keys.size()) i = first_missing(0);  // a key seen earlier may have been removed since
  if (i < keys.size()) {
    c.wait_index = i;
    waiters[keys[i]].push_back(c.id);
    return false;
  }
  c.waiting = false;
  proto::Reply r;
  if (c.wait_type == MsgType::kGet) r.value = data.at(keys[0]);
  c.wait_keys.clear();
  reply(c, c.wait_type, r);
  return true;
}

void TcpStoreServer::Impl::unregister_wait(Conn& c) {
  if (!c.waiting) return;
  auto it = waiters.find(c.wait_keys[c.wait_index]);
  if (it != waiters.end()) {
    std::erase(it->second, c.id);
    if (it->second.empty()) waiters.erase(it);
  }
  c.waiting = false;
  c.wait_keys.clear();
}

void TcpStoreServer::Impl::wake(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiters.erase(it);
  for (uint64_t id : ids) {
    auto ci = conns.find(id);
    if (ci == conns.end() || !ci->second->waiting || !ci->second->alive()) continue;
    Conn& w = *ci->second;
    // Answering may make w's pipelined frames runnable; they run from the
    // loop, never from inside another connection's request.
    guarded(w, "wake", [&] {
      if (advance_wait(w)) runnable.push_back(w.id);
    });
  }
}

void TcpStoreServer::Impl::expire(Clock::time_point now) {
  for (auto& [id, cp] : conns) {
    Conn& c = *cp;
    if (!c.alive()) continue;
    if (c.state != Conn::State::kReady && now >= c.handshake_deadline) {
      if (c.state == Conn::State::kHandshake) {
        uint64_t n = ++handshake_timeouts;
        if (should_warn(n)) {
          TORUS_LOG_WARN("store server {}: the connection from {} did not authenticate within {} ms; closing it "
                         "({} so far)", endpoint, c.peer, opts.handshake_timeout.count(), n);
        }
      }
      close_conn(c);
      continue;
    }
    if (c.waiting && now >= c.wait_deadline) {
      guarded(c, "timeout", [&] {
        proto::Reply r;
        r.status = proto::Status::kTimeout;
        r.missing_keys = missing_keys(c.wait_keys);
        if (r.missing_keys.size() > proto::kMaxReportedKeys) r.missing_keys.resize(proto::kMaxReportedKeys);
        MsgType type = c.wait_type;
        unregister_wait(c);
        reply(c, type, r);
        runnable.push_back(c.id);
      });
    }
  }
}

void TcpStoreServer::Impl::drain_runnable() {
  while (!runnable.empty()) {
    uint64_t id = runnable.front();
    runnable.pop_front();
    auto it = conns.find(id);
    if (it == conns.end() || !it->second->alive()) continue;
    Conn& c = *it->second;
    guarded(c, "request", [&] { process_frames(c); });
  }
}

void TcpStoreServer::Impl::protocol_error(Conn& c, std::string_view why) {
  uint64_t n = ++protocol_errors;
  if (should_warn(n)) {
    TORUS_LOG_WARN("store server {}: protocol error from {} ({}): {}; closing it ({} so far)", endpoint, c.peer,
                   c.state == Conn::State::kHandshake ? "before authentication" : "authenticated", why, n);
  }
  close_conn(c);
}

void TcpStoreServer::Impl::close_conn(Conn& c) {
  if (c.state == Conn::State::kDead) return;
  --live;
  if (c.authenticated) --clients_open;
  untrack_unauth(c);
  unregister_wait(c);
  c.fd.reset();
  c.state = Conn::State::kDead;
  c.in = {};
  c.out = {};
  c.in_off = c.out_off = 0;
}

}  // namespace torus::comm
