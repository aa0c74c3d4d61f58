// The TCP store's wire protocol: frame encoding/decoding with validation, the
// HMAC-SHA-256 handshake helpers, and deadline-bounded socket I/O. The format
// is described at the top of store_protocol.h.
#include "comm/store_protocol.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace torus::comm::store_proto {

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kServerHello: return "server_hello";
    case MsgType::kClientAuth: return "client_auth";
    case MsgType::kServerAuth: return "server_auth";
    case MsgType::kAuthRejected: return "auth_rejected";
    case MsgType::kSet: return "set";
    case MsgType::kGet: return "get";
    case MsgType::kAdd: return "add";
    case MsgType::kWait: return "wait";
    case MsgType::kCheck: return "check";
    case MsgType::kRemove: return "remove";
    case MsgType::kReply: return "reply";
  }
  return "unknown";
}

// ---- FrameWriter ------------------------------------------------------------

FrameWriter::FrameWriter(MsgType type) {
  buf_.resize(kFrameHeaderBytes);
  buf_.push_back(static_cast<uint8_t>(type));
}

FrameWriter& FrameWriter::u8(uint8_t v) {
  buf_.push_back(v);
  return *this;
}

FrameWriter& FrameWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}

FrameWriter& FrameWriter::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}

FrameWriter& FrameWriter::raw(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  buf_.insert(buf_.end(), p, p + n);
  return *this;
}

FrameWriter& FrameWriter::bytes(const void* data, size_t n) {
  // Callers validate sizes first; this guards the u32 field itself.
  TORUS_CHECK(n <= kMaxFrameBytes, InvalidArgument, "store field of {} bytes exceeds the frame limit", n);
  u32(static_cast<uint32_t>(n));
  return raw(data, n);
}

FrameWriter& FrameWriter::keys(const std::vector<std::string>& keys) {
  TORUS_CHECK(keys.size() <= kMaxKeysPerRequest, InvalidArgument,
              "store request names {} keys; at most {} are allowed", keys.size(), kMaxKeysPerRequest);
  u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) bytes(k);
  return *this;
}

std::vector<uint8_t> FrameWriter::finish() && {
  size_t len = buf_.size() - kFrameHeaderBytes;
  TORUS_CHECK(len <= kMaxFrameBytes, InvalidArgument, "store frame of {} bytes exceeds the limit of {}", len,
              kMaxFrameBytes);
  for (int i = 0; i < 4; ++i) buf_[i] = static_cast<uint8_t>(len >> (8 * i));
  return std::move(buf_);
}

uint32_t read_frame_length(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

// ---- FrameReader ------------------------------------------------------------

std::span<const uint8_t> FrameReader::raw(size_t n) {
  if (n > remaining()) {
    throw ProtocolError(fmt::format("truncated frame: need {} more bytes, {} left", n, remaining()));
  }
  auto s = data_.subspan(pos_, n);
  pos_ += n;
  return s;
}

uint8_t FrameReader::u8() { return raw(1)[0]; }

uint32_t FrameReader::u32() { return read_frame_length(raw(4).data()); }

uint64_t FrameReader::u64() {
  auto s = raw(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{s[i]} << (8 * i);
  return v;
}

std::span<const uint8_t> FrameReader::bytes(size_t max_len, const char* what) {
  uint32_t n = u32();
  if (n > max_len) throw ProtocolError(fmt::format("{} of {} bytes exceeds the limit of {}", what, n, max_len));
  return raw(n);
}

std::string FrameReader::key() {
  auto s = bytes(kMaxKeyBytes, "key");
  if (s.empty()) throw ProtocolError("empty key");
  return std::string(reinterpret_cast<const char*>(s.data()), s.size());
}

std::vector<std::string> FrameReader::keys(size_t max_count) {
  uint32_t n = u32();
  if (n > max_count) throw ProtocolError(fmt::format("{} keys exceed the limit of {}", n, max_count));
  // Each key needs at least its length field plus one byte: reject a count the
  // frame cannot hold before reserving anything for it.
  if (size_t{n} * 5 > remaining()) throw ProtocolError(fmt::format("truncated key list of {} keys", n));
  std::vector<std::string> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(key());
  return out;
}

void FrameReader::expect_end() const {
  if (remaining() != 0) throw ProtocolError(fmt::format("{} trailing bytes after the message", remaining()));
}

// ---- requests and replies ---------------------------------------------------

void validate_key(std::string_view key) {
  TORUS_CHECK(!key.empty(), InvalidArgument, "store key must not be empty");
  TORUS_CHECK(key.size() <= kMaxKeyBytes, InvalidArgument, "store key of {} bytes exceeds the limit of {} bytes",
              key.size(), kMaxKeyBytes);
}

std::vector<uint8_t> encode_request(const Request& req) {
  FrameWriter w(req.type);
  switch (req.type) {
    case MsgType::kSet:
      w.bytes(req.keys.at(0)).bytes(req.value.data(), req.value.size());
      break;
    case MsgType::kGet:
      w.u64(req.timeout_ms).bytes(req.keys.at(0));
      break;
    case MsgType::kAdd:
      w.bytes(req.keys.at(0)).i64(req.delta);
      break;
    case MsgType::kWait:
      w.u64(req.timeout_ms).keys(req.keys);
      break;
    case MsgType::kCheck:
      w.keys(req.keys);
      break;
    case MsgType::kRemove:
      w.bytes(req.keys.at(0));
      break;
    default:
      throw InvalidArgument(fmt::format("not a store request: {}", msg_type_name(req.type)));
  }
  return std::move(w).finish();
}

Request decode_request(std::span<const uint8_t> payload) {
  FrameReader r(payload);
  Request req;
  uint8_t type = r.u8();
  req.type = static_cast<MsgType>(type);
  switch (req.type) {
    case MsgType::kSet: {
      req.keys.push_back(r.key());
      auto v = r.bytes(kMaxValueBytes, "value");
      req.value.assign(v.begin(), v.end());
      break;
    }
    case MsgType::kGet:
      req.timeout_ms = r.u64();
      req.keys.push_back(r.key());
      break;
    case MsgType::kAdd:
      req.keys.push_back(r.key());
      req.delta = r.i64();
      break;
    case MsgType::kWait:
      req.timeout_ms = r.u64();
      req.keys = r.keys(kMaxKeysPerRequest);
      break;
    case MsgType::kCheck:
      req.keys = r.keys(kMaxKeysPerRequest);
      break;
    case MsgType::kRemove:
      req.keys.push_back(r.key());
      break;
    default:
      throw ProtocolError(fmt::format("unknown request type {}", type));
  }
  r.expect_end();
  return req;
}

std::vector<uint8_t> encode_reply(MsgType request_type, const Reply& reply) {
  FrameWriter w(MsgType::kReply);
  w.u8(static_cast<uint8_t>(reply.status));
  switch (reply.status) {
    case Status::kOk:
      if (request_type == MsgType::kGet) w.bytes(reply.value.data(), reply.value.size());
      if (request_type == MsgType::kAdd) w.i64(reply.integer);
      if (request_type == MsgType::kCheck || request_type == MsgType::kRemove) w.u8(reply.flag ? 1 : 0);
      break;
    case Status::kTimeout:
      w.keys(reply.missing_keys);
      break;
    case Status::kInvalidArgument:
      w.bytes(reply.message.substr(0, 1024));
      break;
  }
  return std::move(w).finish();
}

Reply decode_reply(MsgType request_type, std::span<const uint8_t> payload) {
  FrameReader r(payload);
  uint8_t type = r.u8();
  if (type != static_cast<uint8_t>(MsgType::kReply)) {
    throw ProtocolError(fmt::format("expected a reply, got message type {}", type));
  }
  Reply reply;
  uint8_t status = r.u8();
  switch (status) {
    case static_cast<uint8_t>(Status::kOk):
      if (request_type == MsgType::kGet) {
        auto v = r.bytes(kMaxValueBytes, "value");
        reply.value.assign(v.begin(), v.end());
      } else if (request_type == MsgType::kAdd) {
        reply.integer = r.i64();
      } else if (request_type == MsgType::kCheck || request_type == MsgType::kRemove) {
        uint8_t f = r.u8();
        if (f > 1) throw ProtocolError(fmt::format("bad boolean {}", f));
        reply.flag = f == 1;
      }
      break;
    case static_cast<uint8_t>(Status::kTimeout):
      if (request_type != MsgType::kGet && request_type != MsgType::kWait) {
        throw ProtocolError(fmt::format("timeout reply to a {} request", msg_type_name(request_type)));
      }
      reply.missing_keys = r.keys(kMaxReportedKeys);
      break;
    case static_cast<uint8_t>(Status::kInvalidArgument): {
      auto m = r.bytes(1024, "error message");
      reply.message.assign(m.begin(), m.end());
      break;
    }
    default:
      throw ProtocolError(fmt::format("unknown reply status {}", status));
  }
  reply.status = static_cast<Status>(status);
  r.expect_end();
  return reply;
}

// ---- authentication ---------------------------------------------------------

Nonce random_nonce() {
  Nonce n{};
  TORUS_CHECK(RAND_bytes(n.data(), static_cast<int>(n.size())) == 1, CommError,
              "the OpenSSL CSPRNG (RAND_bytes) failed to produce a nonce");
  return n;
}

Mac auth_mac(std::string_view token, Direction dir, const Nonce& server_nonce, const Nonce& client_nonce) {
  std::string msg = dir == Direction::kClient ? "torus-store-v1|client|" : "torus-store-v1|server|";
  msg.append(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  msg.append(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  Mac mac{};
  unsigned int len = 0;
  const unsigned char* ok = HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
                                 reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac.data(), &len);
  TORUS_CHECK(ok != nullptr && len == mac.size(), CommError, "HMAC-SHA-256 failed");
  return mac;
}

bool mac_equal(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

namespace {

void read_magic(FrameReader& r) {
  uint32_t magic = r.u32();
  uint8_t version = r.u8();
  if (magic != kMagic) throw ProtocolError(fmt::format("bad magic {:#010x} (not a Torus store peer)", magic));
  if (version != kVersion) {
    throw ProtocolError(fmt::format("store protocol version {} is not supported (this build speaks {})", version,
                                    kVersion));
  }
}

void expect_type(FrameReader& r, MsgType want) {
  uint8_t t = r.u8();
  if (t != static_cast<uint8_t>(want)) {
    throw ProtocolError(fmt::format("expected {} message, got type {}", msg_type_name(want), t));
  }
}

}  // namespace

std::vector<uint8_t> encode_server_hello(const Nonce& server_nonce) {
  return std::move(FrameWriter(MsgType::kServerHello).u32(kMagic).u8(kVersion).raw(server_nonce.data(), kNonceBytes))
      .finish();
}

Nonce decode_server_hello(std::span<const uint8_t> payload) {
  FrameReader r(payload);
  expect_type(r, MsgType::kServerHello);
  read_magic(r);
  Nonce n{};
  auto s = r.raw(kNonceBytes);
  std::memcpy(n.data(), s.data(), kNonceBytes);
  r.expect_end();
  return n;
}

std::vector<uint8_t> encode_client_auth(const Nonce& client_nonce, const Mac& mac) {
  return std::move(FrameWriter(MsgType::kClientAuth)
                       .u32(kMagic)
                       .u8(kVersion)
                       .raw(client_nonce.data(), kNonceBytes)
                       .raw(mac.data(), kMacBytes))
      .finish();
}

void decode_client_auth(std::span<const uint8_t> payload, Nonce* client_nonce, Mac* mac) {
  FrameReader r(payload);
  expect_type(r, MsgType::kClientAuth);
  read_magic(r);
  auto n = r.raw(kNonceBytes);
  auto m = r.raw(kMacBytes);
  r.expect_end();
  std::memcpy(client_nonce->data(), n.data(), kNonceBytes);
  std::memcpy(mac->data(), m.data(), kMacBytes);
}

std::vector<uint8_t> encode_server_auth(const Mac& mac) {
  return std::move(FrameWriter(MsgType::kServerAuth).raw(mac.data(), kMacBytes)).finish();
}

std::vector<uint8_t> encode_auth_rejected() { return FrameWriter(MsgType::kAuthRejected).finish(); }

bool decode_server_auth(std::span<const uint8_t> payload, Mac* mac) {
  FrameReader r(payload);
  uint8_t t = r.u8();
  if (t == static_cast<uint8_t>(MsgType::kAuthRejected)) {
    r.expect_end();
    return false;
  }
  if (t != static_cast<uint8_t>(MsgType::kServerAuth)) {
    throw ProtocolError(fmt::format("expected server_auth message, got type {}", t));
  }
  auto m = r.raw(kMacBytes);
  r.expect_end();
  std::memcpy(mac->data(), m.data(), kMacBytes);
  return true;
}

// ---- sockets ----------------------------------------------------------------

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

// Waits for `events` on fd until the deadline; returns kOk, kTimeout or kError.
IoResult wait_fd(int fd, short events, Clock::time_point deadline, int* err) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return IoResult::kTimeout;
    pollfd p{fd, events, 0};
    // Sleep in slices of at most a minute so that a deadline far away does not
    // overflow poll's int argument.
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 60000)));
    if (rc < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return IoResult::kError;
    }
    if (rc > 0) return IoResult::kOk;  // readiness or error: the next syscall tells which
  }
}

}  // namespace

IoResult write_all(int fd, const uint8_t* data, size_t n, Clock::time_point deadline, int* err) {
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::send(fd, data + done, n - done, MSG_NOSIGNAL);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      IoResult r = wait_fd(fd, POLLOUT, deadline, err);
      if (r != IoResult::kOk) return r;
      continue;
    }
    *err = errno;
    return (errno == EPIPE || errno == ECONNRESET) ? IoResult::kClosed : IoResult::kError;
  }
  return IoResult::kOk;
}

IoResult read_exact(int fd, uint8_t* data, size_t n, Clock::time_point deadline, int* err) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::recv(fd, data + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      IoResult res = wait_fd(fd, POLLIN, deadline, err);
      if (res != IoResult::kOk) return res;
      continue;
    }
    *err = errno;
    return errno == ECONNRESET ? IoResult::kClosed : IoResult::kError;
  }
  return IoResult::kOk;
}

IoResult read_frame(int fd, size_t max_len, Clock::time_point deadline, std::vector<uint8_t>* payload, int* err) {
  uint8_t hdr[kFrameHeaderBytes];
  IoResult r = read_exact(fd, hdr, sizeof(hdr), deadline, err);
  if (r != IoResult::kOk) return r;
  uint32_t len = read_frame_length(hdr);
  if (len == 0 || len > max_len) {
    throw ProtocolError(fmt::format("peer sent a frame of {} bytes (limit {})", len, max_len));
  }
  payload->resize(len);
  return read_exact(fd, payload->data(), len, deadline, err);
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  TORUS_CHECK_SYS(flags, "fcntl(F_GETFL)");
  TORUS_CHECK_SYS(::fcntl(fd, F_SETFL, flags | O_NONBLOCK), "fcntl(O_NONBLOCK)");
}

void set_stream_options(int fd) {
  int one = 1;
  // Best effort: neither option is needed for correctness.
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

std::string sockaddr_host(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, host, sizeof(host));
    return host;
  }
  if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, host, sizeof(host));
    return host;
  }
  return fmt::format("<address family {}>", sa->sa_family);
}

std::string sockaddr_to_string(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return fmt::format("{}:{}", sockaddr_host(sa), ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    return fmt::format("[{}]:{}", sockaddr_host(sa), ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port));
  }
  return sockaddr_host(sa);
}

std::string printable_key(std::string_view key) {
  constexpr size_t kShown = 128;
  std::string out = "'";
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (key.size() > kShown) out += fmt::format("...' ({} bytes)", key.size());
  else out += "'";
  return out;
}

std::string printable_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) {
    if (i) out += ", ";
    out += printable_key(keys[i]);
  }
  if (keys.size() > kShown) out += fmt::format(" and {} more", keys.size() - kShown);
  return out;
}

Clock::time_point deadline_after(std::chrono::milliseconds d) {
  // A year is "forever" for a rendezvous and keeps the arithmetic far from overflow.
  constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365);
  if (d < std::chrono::milliseconds::zero()) d = std::chrono::milliseconds::zero();
  return Clock::now() + std::min(d, kForever);
}

}  // namespace torus::comm::store_proto
