// Private: an op of the ofi progress engine (engine.h) and what it is made
// of — the engine's clock, the libfabric requests it posts, the scratch
// memory it borrows, and OpCtx, the view of its op an algorithm coroutine
// has (posting, waiting, scratch; implemented in op_ctx.cpp). The engine
// that runs ops, their order and failures: engine.h.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/ofi/fabric.h"
#include "comm/ofi/tags.h"
#include "comm/ofi/task.h"
#include "torus/comm/work.h"

namespace torus::comm::ofi {

// The engine's clock: monotonic and coarse (CLOCK_MONOTONIC_COARSE, a few
// milliseconds of resolution), which is plenty for deadlines of many
// milliseconds and costs a fraction of a precise read on every op.
struct Clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<Clock, duration>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept {
    timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return time_point(duration(static_cast<rep>(ts.tv_sec) * 1000000000 + ts.tv_nsec));
  }
};

class Engine;
struct GroupState;
class OfiWork;
struct Op;

// One posted libfabric operation. Owned by the engine's pool.
struct Request {
  fi_context2 fi_ctx;  // first member: the context handed to the provider
  // kQueued: waiting to be handed to the provider (its queues were full).
  enum class State : uint8_t { kFree, kQueued, kPending, kDone, kFailed };
  State state = State::kFree;
  bool orphan = false;     // its op is gone: free it when its completion arrives
  bool control = false;    // an engine control message buffer
  const char* what = "";   // "send", "recv"
  int peer = -1;           // world rank of the peer, -1 unknown
  size_t bytes = 0;
  size_t got = 0;          // bytes received (from the completion)
  std::string error;
  Request* prev = nullptr;  // intrusive list of the owning op's live requests
  Request* next = nullptr;
  // What to post (kept for a retry while queued).
  bool is_send = false;
  bool tagged = true;
  void* buf = nullptr;
  void* desc = nullptr;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  uint64_t tag = 0;

  bool done() const { return state == State::kDone || state == State::kFailed; }
};

// A scratch buffer lent to one op (registered when the provider needs it).
struct Scratch {
  struct Free {
    void operator()(char* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<char, Free> data;
  size_t bytes = 0;
  MemoryRegion mr;  // destroyed before the memory it covers
  bool pooled = true;  // false: freed when its op ends instead of kept for reuse
};

// What an algorithm coroutine sees of its op: posting, waiting, scratch
// memory. Driver thread only.
class OpCtx {
 public:
  OpCtx(Engine& engine, Op& op);
  ~OpCtx();
  OpCtx(const OpCtx&) = delete;
  OpCtx& operator=(const OpCtx&) = delete;

  Engine& engine() { return engine_; }
  const WorkInfo& info() const;
  Clock::time_point deadline() const;
  Suspension& suspension() { return susp_; }

  // Post a tagged send/recv to/from view rank `peer` with payload (the op's
  // sequence number for collectives, the user tag for p2p). Retries while
  // the provider's queues are full, driving the CQ; throws TimeoutError past
  // the deadline and CommError on a hard failure.
  Request* send(const PeerView& v, int peer, const void* buf, size_t bytes, uint64_t payload);
  Request* recv(const PeerView& v, int peer, void* buf, size_t bytes, uint64_t payload);

  // Suspends until every request is done, then releases them. Throws
  // CommError naming the peer if one failed.
  auto wait(Request* a, Request* b = nullptr) {
    return Until(susp_, [a, b] { return (a == nullptr || a->done()) && (b == nullptr || b->done()); },
                 [this] { return describe_pending(); });
  }
  // As wait(), for a list; the list must outlive the co_await.
  auto wait_all(const std::vector<Request*>& rs) {
    return Until(susp_, [&rs] {
      for (Request* r : rs) {
        if (!r->done()) return false;
      }
      return true;
    }, [this] { return describe_pending(); });
  }
  // After a wait: throw if any failed, release them all.
  void finish(Request* r);
  void finish_all(std::vector<Request*>& rs);

  // Suspends until pred() holds (host segment flags, etc.).
  template <typename Pred, typename Describe = std::nullptr_t>
  auto until(Pred pred, Describe describe = nullptr) {
    return Until<Pred, Describe>(susp_, std::move(pred), std::move(describe));
  }

  // A scratch buffer of at least `bytes`, 64-byte aligned, until the op ends.
  char* scratch(size_t bytes);
  // The same for staging a device buffer (Note [Device buffers]): above
  // kMaxPooledStagingBytes it is freed when the op ends instead of going to
  // the pool, which would keep the largest buffers of the world's life.
  char* staging(size_t bytes);

  // The local descriptor for [buf, buf+bytes) (nullptr when the provider
  // does not need one); registers and caches it for the op's lifetime.
  void* desc(const void* buf, size_t bytes);

  // The op's own buffers (not its scratch) are device memory of `kind` on
  // `device`, passed at the addresses the NIC knows them by: desc()
  // registers them as such, whether or not the provider asks for local
  // descriptors of host memory (FI_MR_HMEM wants one for device memory).
  void set_device_memory(MemoryKind kind, int device) {
    mem_kind_ = kind;
    mem_device_ = device;
  }

  // Outstanding requests, for timeout messages: "recv from rank 2 (4096 B)".
  std::string describe_pending() const;
  std::string describe_wait() const;

  // Cancels whatever is still pending (op failed); the engine frees them.
  void abandon();

  // The op runs (or began) outside the driver (Engine::run_inline): its
  // scratch memory is its own, not the engine's pool's.
  void set_detached() { detached_ = true; }

  // World rank of a same-host peer this op waits for whose process is gone,
  // or -1.
  int find_dead_local_peer() const;

  // World rank of the peer of the request whose failure failed this op, or -1.
  int failed_peer() const { return failed_peer_; }

  Task root;

 private:
  Request* post(bool is_send, const PeerView& v, int peer, void* buf, size_t bytes, uint64_t payload);
  Engine& engine_;
  Op& op_;
  Suspension susp_;
  Request* live_ = nullptr;  // intrusive list of this op's live requests
  int failed_peer_ = -1;
  std::vector<std::unique_ptr<Scratch>> scratch_;
  bool detached_ = false;
  std::vector<std::unique_ptr<Scratch>> own_scratch_;  // detached: never registered, freed with the op
  struct Registration {
    const char* base;
    size_t bytes;
    MemoryRegion mr;
  };
  std::vector<Registration> regs_;
  MemoryKind mem_kind_ = MemoryKind::kHost;
  int mem_device_ = 0;
};

// One queued or running op. The coroutine that performs it is made when it
// starts (make()); OpWith carries the body in the same allocation.
struct Op {
  static void* operator new(size_t n) { return detail::cache_take(n); }
  static void operator delete(void* p, size_t n) { detail::cache_give(p, n); }
  virtual ~Op() = default;
  virtual Task make(OpCtx& c) = 0;
  std::shared_ptr<OfiWork> work;
  std::shared_ptr<GroupState> group;
  std::shared_ptr<const void> keep;  // what the op's coroutine points into (the group's topology)
  bool collective = true;
  Clock::time_point issued;
  Clock::time_point deadline;
  Clock::time_point next_liveness_check{};
  std::optional<OpCtx> ctx;  // set when started
  // Note [Held provider errors]: a provider error kept back while a peer's
  // abort notice may still name the cause; the op fails at hold_until.
  std::exception_ptr held_error;
  Clock::time_point hold_until{};
};

template <typename Body>
struct OpWith final : Op {
  explicit OpWith(Body b) : body(std::move(b)) {}
  Task make(OpCtx& c) override { return body(c); }
  Body body;
};

}  // namespace torus::comm::ofi
