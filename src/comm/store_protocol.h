// Private: the wire protocol of the TCP store, shared by TcpStore (client) and
// TcpStoreServer. It holds frame encoding and decoding with full validation,
// the HMAC-SHA-256 handshake helpers (Note [Store security] in
// torus/comm/store.h), and the small socket utilities both sides need.
//
// Wire format. Every message is one frame:
//   u32 length (little endian, 1..kMaxFrameBytes) | u8 message type | fields
// Integers are little endian; a byte string is u32 length + bytes; a key list
// is u32 count (<= kMaxKeysPerRequest) + that many byte strings. A frame must
// be consumed exactly: trailing bytes are a protocol error.
//
// Handshake (before it completes, frames are limited to kMaxHandshakeFrameBytes,
// so an unauthenticated peer cannot make the server buffer more than that):
//   server -> client  kServerHello  u32 magic, u8 version, server nonce[32]
//   client -> server  kClientAuth   u32 magic, u8 version, client nonce[32],
//                                   HMAC(token, "torus-store-v1|client|" + Ns + Nc)
//   server -> client  kServerAuth   HMAC(token, "torus-store-v1|server|" + Ns + Nc)
//                  or kAuthRejected (then the server closes)
// The direction label differs, so neither side's MAC can be reflected back.
//
// Requests (one at a time per connection):
//   kSet    key, value             -> kOk
//   kGet    u64 timeout_ms, key    -> kOk value | kTimeout
//   kAdd    key, i64 delta         -> kOk i64 | kInvalidArgument message
//   kWait   u64 timeout_ms, keys   -> kOk | kTimeout
//   kCheck  keys                   -> kOk u8
//   kRemove key                    -> kOk u8
// Reply frame: u8 kReply, u8 status, then the body for that status:
//   kOk: as above; kTimeout: up to kMaxReportedKeys missing keys (a key list);
//   kInvalidArgument: a message string.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "torus/comm/store.h"
#include "torus/core/error.h"

struct sockaddr;

namespace torus::comm::store_proto {

using Clock = std::chrono::steady_clock;

inline constexpr uint32_t kMagic = 0x53525454;  // "TTRS" read little endian
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kMaxHandshakeFrameBytes = 128;
inline constexpr size_t kMaxKeysPerRequest = 4096;
inline constexpr size_t kMaxReportedKeys = 8;
// The largest frame either side accepts: a set of the largest value under the
// largest key, with room for the fixed fields.
inline constexpr size_t kMaxFrameBytes = kMaxValueBytes + kMaxKeyBytes + 256;
static_assert(1 + 8 + 4 + kMaxKeysPerRequest * (4 + kMaxKeyBytes) <= kMaxFrameBytes,
              "a wait on the most keys of the largest size must fit in one frame");
static_assert(kMaxFrameBytes <= UINT32_MAX);

enum class MsgType : uint8_t {
  kServerHello = 1,
  kClientAuth = 2,
  kServerAuth = 3,
  kAuthRejected = 4,
  kSet = 16,
  kGet = 17,
  kAdd = 18,
  kWait = 19,
  kCheck = 20,
  kRemove = 21,
  kReply = 32,
};

enum class Status : uint8_t { kOk = 0, kTimeout = 1, kInvalidArgument = 2 };

const char* msg_type_name(MsgType t);

// A frame or field that breaks the protocol. Derives from CommError, which is
// what a client reports when the server sends one.
class ProtocolError : public CommError {
 public:
  using CommError::CommError;
};

// ---- encoding -------------------------------------------------------------

// Builds one frame; finish() writes the length prefix and returns the bytes.
class FrameWriter {
 public:
  explicit FrameWriter(MsgType type);
  FrameWriter& u8(uint8_t v);
  FrameWriter& u32(uint32_t v);
  FrameWriter& u64(uint64_t v);
  FrameWriter& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  FrameWriter& raw(const void* data, size_t n);
  FrameWriter& bytes(const void* data, size_t n);  // u32 length + bytes
  FrameWriter& bytes(std::string_view s) { return bytes(s.data(), s.size()); }
  FrameWriter& keys(const std::vector<std::string>& keys);
  std::vector<uint8_t> finish() &&;

 private:
  std::vector<uint8_t> buf_;
};

// Reads the payload of one frame (after the length prefix); every accessor
// throws ProtocolError on truncation or an out-of-bounds length.
class FrameReader {
 public:
  explicit FrameReader(std::span<const uint8_t> payload) : data_(payload) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::span<const uint8_t> raw(size_t n);
  std::span<const uint8_t> bytes(size_t max_len, const char* what);
  std::string key();  // non-empty, <= kMaxKeyBytes
  std::vector<std::string> keys(size_t max_count);
  void expect_end() const;  // throws if bytes remain
  size_t remaining() const { return data_.size() - pos_; }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

// Reads the u32 frame length at p (kFrameHeaderBytes bytes).
uint32_t read_frame_length(const uint8_t* p);

// ---- requests and replies ---------------------------------------------------

struct Request {
  MsgType type = MsgType::kSet;
  std::vector<std::string> keys;  // one key except for wait/check
  std::vector<uint8_t> value;     // set
  int64_t delta = 0;              // add
  uint64_t timeout_ms = 0;        // get/wait
};

std::vector<uint8_t> encode_request(const Request& req);
// Decodes and validates a whole request payload; throws ProtocolError.
Request decode_request(std::span<const uint8_t> payload);

struct Reply {
  Status status = Status::kOk;
  std::vector<uint8_t> value;             // get
  int64_t integer = 0;                    // add
  bool flag = false;                      // check, remove
  std::vector<std::string> missing_keys;  // timeout
  std::string message;                    // invalid argument
};

std::vector<uint8_t> encode_reply(MsgType request_type, const Reply& reply);
// Decodes the reply to a request of `request_type`; throws ProtocolError.
Reply decode_reply(MsgType request_type, std::span<const uint8_t> payload);

// Throws InvalidArgument unless 0 < key.size() <= kMaxKeyBytes.
void validate_key(std::string_view key);

// ---- authentication ---------------------------------------------------------

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;
enum class Direction { kClient, kServer };

Nonce random_nonce();  // RAND_bytes; throws CommError if the CSPRNG fails
Mac auth_mac(std::string_view token, Direction dir, const Nonce& server_nonce, const Nonce& client_nonce);
bool mac_equal(const Mac& a, const Mac& b);  // constant time

std::vector<uint8_t> encode_server_hello(const Nonce& server_nonce);
Nonce decode_server_hello(std::span<const uint8_t> payload);
std::vector<uint8_t> encode_client_auth(const Nonce& client_nonce, const Mac& mac);
void decode_client_auth(std::span<const uint8_t> payload, Nonce* client_nonce, Mac* mac);
std::vector<uint8_t> encode_server_auth(const Mac& mac);
std::vector<uint8_t> encode_auth_rejected();
// Returns false for kAuthRejected; throws ProtocolError for anything else.
bool decode_server_auth(std::span<const uint8_t> payload, Mac* mac);

// ---- sockets ----------------------------------------------------------------

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

enum class IoResult { kOk, kClosed, kTimeout, kError };

// Blocking-with-deadline I/O on a non-blocking socket (poll, then send/recv).
// On kError, *err holds errno.
IoResult write_all(int fd, const uint8_t* data, size_t n, Clock::time_point deadline, int* err);
IoResult read_exact(int fd, uint8_t* data, size_t n, Clock::time_point deadline, int* err);
// Reads one frame's payload (after validating its length against max_len).
IoResult read_frame(int fd, size_t max_len, Clock::time_point deadline, std::vector<uint8_t>* payload, int* err);

void set_nonblocking(int fd);
void set_stream_options(int fd);  // TCP_NODELAY and SO_KEEPALIVE

// "1.2.3.4:5" or "[::1]:5".
std::string sockaddr_to_string(const sockaddr* sa);
// The numeric address alone: "1.2.3.4" or "::1".
std::string sockaddr_host(const sockaddr* sa);
// A key for an error message: printable, escaped and truncated.
std::string printable_key(std::string_view key);
std::string printable_keys(const std::vector<std::string>& keys);

// now + d, saturating (d may be Duration::max()).
Clock::time_point deadline_after(std::chrono::milliseconds d);

}  // namespace torus::comm::store_proto
