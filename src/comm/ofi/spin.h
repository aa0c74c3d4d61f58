// Private: how the ofi backend waits, in one place. Every wait polls
// something (a completion queue, a peer's line in shared memory); after each
// poll that found nothing a Backoff decides what comes before the next one:
// first a pause instruction (no clock read, no system call: most waits for a
// peer in step end there), then sched_yield (ranks may outnumber cores, and
// the one waited for may need this core to get there), then short naps. How
// many polls each stage lasts is the WaitPolicy of the kind of wait
// (wait_policy()); when the host's ranks outnumber its cores
// (OfiOptions::oversubscribed) they pause only a few times before yielding.
#pragma once

#include <sched.h>

#include <chrono>
#include <limits>
#include <thread>

namespace torus::comm::ofi {

// After its n-th poll that found nothing (n from 0) a wait pauses while
// n < pauses, yields while n < pauses + yields, and naps `nap` after that.
struct WaitPolicy {
  unsigned pauses = 0;
  unsigned yields = 0;
  std::chrono::microseconds nap{0};
};

inline constexpr unsigned kUnlimited = std::numeric_limits<unsigned>::max();

// The kinds of wait in the backend.
enum class Wait {
  // The engine's driving loops (Engine::drive_until, its thread): unbounded,
  // so they end up napping. 64 polls before the first yield (63 pauses), or
  // 4 (3) oversubscribed; then 4096 yields; then naps of 50 us.
  kDrive,
  // Waits in the caller's thread (Note [Inline ops] in engine.h, Note
  // [Inline mailbox all_reduce] in host_collectives.h), bounded by time
  // (spin_politely): 128 pauses, or 4 oversubscribed, then yields.
  kInline,
  // A send that waits for a same-host peer to leave the provider (the
  // gates in engine_io.cpp; live ones leave within a few hundred
  // nanoseconds): 64 pauses, a few microseconds, and then the caller gives
  // up (it defers the send), oversubscribed or not.
  kGate,
};

constexpr WaitPolicy wait_policy(Wait w, bool oversubscribed) {
  switch (w) {
    case Wait::kDrive:
      return {.pauses = oversubscribed ? 3u : 63u, .yields = 4096, .nap = std::chrono::microseconds(50)};
    case Wait::kInline:
      return {.pauses = oversubscribed ? 4u : 128u, .yields = kUnlimited};
    case Wait::kGate:
      return {.pauses = 64};
  }
  return {};
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The state of one wait: wait() after each poll that found nothing, reset()
// after one that found something (the next wait starts with pauses again).
class Backoff {
 public:
  explicit Backoff(WaitPolicy p) : p_(p) {}

  void wait() {
    if (polls_ < p_.pauses) {
      cpu_relax();
    } else if (polls_ - p_.pauses < p_.yields) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(p_.nap);
    }
    if (polls_ < kUnlimited) ++polls_;
  }
  void reset() { polls_ = 0; }

  // The wait()s since the start or the last reset().
  unsigned polls() const { return polls_; }
  // Whether the next wait() only pauses.
  bool spinning() const { return polls_ < p_.pauses; }

 private:
  WaitPolicy p_;
  unsigned polls_ = 0;
};

// A wait bounded by time, with policy `p`: calls done() until it returns
// true (then returns true), or, once the pauses are used up, until `budget`
// has passed since or stop() returns true (then returns false). Neither the
// clock nor stop() is read while it only pauses.
template <typename Done, typename Stop>
bool spin_politely(WaitPolicy p, std::chrono::nanoseconds budget, Done done, Stop stop) {
  Backoff backoff(p);
  std::chrono::steady_clock::time_point until{};
  for (;; backoff.wait()) {
    if (done()) return true;
    if (backoff.spinning()) continue;
    const auto now = std::chrono::steady_clock::now();
    if (backoff.polls() == p.pauses) {
      until = now + budget;
    } else if (now >= until || stop()) {
      return false;
    }
  }
}

}  // namespace torus::comm::ofi
