// torus/comm/store.h — the rendezvous key-value store.
//
// A TCP store hosted by rank 0 (TcpStoreServer) and reached by every rank,
// rank 0 included, through a TcpStore client. It exchanges endpoint addresses,
// NCCL unique ids and bootstrap facts, so nothing needs MPI to start.
//
// Security (Note [Store security]): the server listens only on the address it
// is given (the interface the bootstrap chose). Every connection proves
// knowledge of the job token with an HMAC-SHA-256 challenge–response in both
// directions before any command is served; the token itself never crosses the
// wire. Every frame is size-bounded (keys <= kMaxKeyBytes, values <=
// kMaxValueBytes) and validated; a malformed, oversized, unauthenticated or
// idle-during-handshake connection is logged and closed, never crashing the
// server, blocking other clients, or changing any key.
//
// Admission: connections that have not finished the handshake are bounded
// in all (max_unauthenticated) and per source address
// (max_unauthenticated_per_address) and closed after handshake_timeout; past
// a bound, or when all max_connections are taken, the oldest unauthenticated
// connection (of that address) is closed to admit the new one. So a flood of
// idle connections, even from the ranks' own address, cannot hold the slots
// that joining ranks need: a rank is only ever refused when max_connections
// authenticated clients are connected. A client whose handshake is cut off
// this way retries (until connect_timeout); only an explicit rejection of
// its token is final.
//
// All client methods are thread safe (one request in flight per client;
// callers serialise on a mutex) and take a timeout; passing it throws
// TimeoutError naming the key(s). A lost server throws CommError.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torus::comm {

inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = size_t{64} << 20;

class Store {
 public:
  using Duration = std::chrono::milliseconds;
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits until `key` exists (up to timeout), then returns its value.
  virtual std::vector<uint8_t> get(const std::string& key, Duration timeout) = 0;
  // Atomically adds delta to the integer stored at key (absent = 0); returns
  // the new value. Integers are stored as decimal text.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until all keys exist.
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  // True if all keys exist now. Never blocks on keys.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Removes key; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;

  // Convenience for text values.
  void set_string(const std::string& key, const std::string& value);
  std::string get_string(const std::string& key, Duration timeout);
};

// A view of another store with every key prefixed by "<prefix>/".
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// The server: owned by rank 0. Starts listening in the constructor and serves
// from one background thread until destroyed.
class TcpStoreServer {
 public:
  struct Options {
    std::string bind_addr = "127.0.0.1";  // numeric IPv4/IPv6 address to listen on
    int port = 0;                         // 0 = any free port
    std::string token;                    // job token; must be non-empty
    // A legitimate client finishes the handshake in two round trips; longer
    // only helps a peer that holds slots without authenticating.
    std::chrono::milliseconds handshake_timeout{2000};
    int max_connections = 4096;
    // Bounds on connections that have not authenticated yet (see Admission
    // above); each must be >= 1 and is capped by the bound above it.
    int max_unauthenticated = 2048;
    int max_unauthenticated_per_address = 1024;
  };
  explicit TcpStoreServer(Options options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;                      // the bound port
  const std::string& address() const;    // the bound address

  struct Stats {
    uint64_t connections_accepted = 0;
    uint64_t auth_failures = 0;
    uint64_t protocol_errors = 0;
    uint64_t requests_served = 0;
    uint64_t connections_refused = 0;  // over max_connections, all of them authenticated
    uint64_t handshake_timeouts = 0;   // closed for not finishing the handshake in time
    uint64_t unauthenticated_evicted = 0;  // closed to admit a newer connection (Admission)
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The client.
class TcpStore final : public Store {
 public:
  struct Options {
    std::string host;                    // server address or host name
    int port = 0;
    std::string token;
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(5)};  // retries until then
    // Deadline for a reply to set/add/check/remove (get and wait use their own
    // timeout plus a margin). Passing it throws TimeoutError.
    std::chrono::milliseconds request_timeout{std::chrono::minutes(5)};
  };
  explicit TcpStore(Options options);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A fresh random job token (hex, 256 bits) from the OS CSPRNG.
std::string generate_job_token();

}  // namespace torus::comm
