// Private: the bounded, polite busy-wait of the inline paths (Note [Inline
// mailbox all_reduce] in host_collectives.h, Engine::run_inline).
#pragma once

#include <sched.h>

#include <chrono>

namespace torus::comm::ofi {

// Calls done() until it returns true (then returns true), `budget` has
// passed or stop() returns true (then returns false). The first tries only
// pause the core, with no clock read: most waits of a peer in step end
// there. After them it yields between tries, because ranks may outnumber
// cores and the peer it waits for may need this core to get there.
// `pauses`: the tries before the first yield (kSpinPauses, or few when the
// host's ranks outnumber its cores: the peer then often needs this core).
inline constexpr unsigned kSpinPauses = 128;
inline constexpr unsigned kOversubscribedPauses = 4;

template <typename Done, typename Stop>
bool spin_politely(std::chrono::nanoseconds budget, Done done, Stop stop, unsigned pauses = kSpinPauses) {
  const unsigned kPauses = pauses;
  std::chrono::steady_clock::time_point until{};
  for (unsigned i = 0;; ++i) {
    if (done()) return true;
    if (i < kPauses) {
      __builtin_ia32_pause();
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (i == kPauses) {
      until = now + budget;
    } else if (now >= until || stop()) {
      return false;
    }
    sched_yield();
  }
}

}  // namespace torus::comm::ofi
