// The progress engine's failure handling (engine.h, Note [Failure]): a
// provider error held back while a peer's notice may name its cause (Note
// [Held provider errors]), failing an op and breaking its group (with an
// announcement to the peers for hard failures), abort (break_group), the
// periodic deadline and liveness checks, and whether a same-host peer is gone
// (Note [Never send to the dead]).
#include "comm/ofi/engine.h"

#include <string>
#include <vector>

#include "core/log.h"

namespace torus::comm::ofi {
namespace {

constexpr auto kLivenessPeriod = std::chrono::milliseconds(100);

}  // namespace

void Engine::break_group(const std::shared_ptr<GroupState>& g, const std::string& reason, bool announce) {
  if (!g->set_broken(reason)) return;
  TORUS_LOG_WARN("ofi: group '{}' is broken: {}", g->name, reason);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (announce) notices_.emplace_back(g, reason);
    has_incoming_.store(true, std::memory_order_release);
    wake = deep_sleep_.load(std::memory_order_relaxed);
  }
  if (wake) cv_.notify_one();
}

// Note [Held provider errors]: when ranks disagree on a message's size, the
// rank that received the longer message usually gets FI_ETRUNC ("ranks
// passed different sizes"), but shm sometimes reports it as a plain I/O
// error, and a peer's failure shows up the same way on a live link. The
// peer that found the cause announces it (an abort notice) a moment later.
// So a provider error on a group that is not broken yet is held for
// kProviderErrorHold: the op's requests are abandoned at once, and the op
// fails with the notice's cause if one arrives (poll_once: the group is
// broken), else with its own error when the hold ends. Timeouts, refusals
// and errors that already name the cause are not held.
constexpr std::chrono::milliseconds kProviderErrorHold{300};

bool Engine::hold_or_fail(Op& op, std::exception_ptr error, std::vector<Completion>& done) {
  bool holdable = false;
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
  } catch (const CommError& e) {
    const std::string what = e.what();
    holdable = what.find("(provider:") != std::string::npos && what.find("different sizes") == std::string::npos;
  } catch (...) {
  }
  if (!holdable || op.held_error || op.group->broken()) {
    fail(op, error, done);
    return true;
  }
  if (op.ctx) op.ctx->abandon();
  op.held_error = error;
  op.hold_until = Clock::now() + kProviderErrorHold;
  hard_failure_ = true;  // a provider error, whatever its cause: teardown must not trust the endpoint
  return false;
}

void Engine::fail(Op& op, std::exception_ptr error, std::vector<Completion>& done) {
  const int suspect = op.ctx ? op.ctx->failed_peer() : -1;
  if (op.ctx) op.ctx->abandon();
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown error";
  }
  bool timed_out = false;
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    timed_out = true;
  } catch (...) {
  }
  // A failure caused by a peer's death often shows up first as an error on
  // another link (e.g. a live peer that already failed because of it and
  // freed its buffers); name the dying same-host processes so the cause is
  // clear. Thorough: the kernel shows a killed process as exiting long
  // before it has terminated.
  std::vector<std::string> dead;
  for (int w : op.group->member_world) {
    if (w == world_rank_ || !peer_gone(w, true)) continue;
    if (what.find(fmt::format("world rank {} ", w)) == std::string::npos) dead.push_back(describe_gone(w));
  }
  if (!dead.empty()) {
    what += fmt::format("; note: {}", fmt::join(dead, "; "));
    error = timed_out ? std::make_exception_ptr(TimeoutError(what)) : std::make_exception_ptr(CommError(what));
  }
  if (!timed_out) hard_failure_ = true;
  if (op.group->set_broken(what)) {
    TORUS_LOG_WARN("ofi: group '{}' is broken: {}", op.group->name, what);
    if (!timed_out) announce(*op.group, what, suspect);
  }
  finish(op, error, done);
}

void Engine::check_deadlines(Clock::time_point now, std::vector<Completion>& done) {
  auto timeout = [&](Op& op, const std::string& detail) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(op.deadline - op.issued).count();
    fail(op, std::make_exception_ptr(TimeoutError(fmt::format("{} timed out after {} ms{}",
                                                              op.work->info().describe(), ms, detail))),
         done);
  };
  for (auto& g : groups_) {
    for (size_t i = 0; i < g->queue.size(); ++i) {
      Op& op = *g->queue[i];
      if (op.ctx && !op.held_error && now >= op.next_liveness_check) {
        op.next_liveness_check = now + kLivenessPeriod;
        if (check_liveness(op, done)) {
          g->queue.erase(g->queue.begin() + static_cast<long>(i));
          break;
        }
      }
      if (now < op.deadline || op.held_error) continue;  // a held op fails with its own error soon
      std::string detail = op.ctx ? "; waiting for " + op.ctx->describe_wait()
                                  : fmt::format("; it had not started, queued behind {}",
                                                g->queue.front()->work->info().describe());
      timeout(op, detail);
      g->queue.erase(g->queue.begin() + static_cast<long>(i));
      break;  // the group is broken now; the rest fail at their next step
    }
  }
  for (size_t i = 0; i < p2p_.size();) {
    Op& op = *p2p_[i];
    bool gone = false;
    if (op.ctx && !op.held_error && now >= op.next_liveness_check) {
      op.next_liveness_check = now + kLivenessPeriod;
      gone = check_liveness(op, done);
    }
    if (!gone && !op.held_error && now >= op.deadline) {
      timeout(op, op.ctx ? "; waiting for " + op.ctx->describe_wait() : std::string());
      gone = true;
    }
    if (gone) {
      p2p_[i] = std::move(p2p_.back());
      p2p_.pop_back();
    } else {
      ++i;
    }
  }
}

bool Engine::check_liveness(Op& op, std::vector<Completion>& done) {
  int dead = op.ctx->find_dead_local_peer();
  if (dead < 0) return false;
  fail(op, std::make_exception_ptr(CommError(fmt::format(
               "{} failed: peer world rank {} (pid {}) on this host exited while this op waited for it",
               op.work->info().describe(), dead, local_pid(dead)))),
       done);
  return true;
}

bool Engine::peer_gone(int world, bool thorough) const {
  if (world < 0 || static_cast<size_t>(world) >= peers_.size()) return false;
  const size_t w = static_cast<size_t>(world);
  if (gone_[w].load(std::memory_order_acquire)) return true;
  const PeerProcess& p = peers_[w];
  if (!p.watched()) return false;  // not on this host: the provider or the deadline tells
  // Cheap: one load when the peer's mark is mapped (a peer that died outside
  // the provider left nothing to hang on); without a mark, nothing (sends
  // to a dead peer cannot hang then; the liveness check finds it).
  const bool gone = thorough ? p.dying() : p.provider_state() == PeerProcess::State::kDiedInside;
  if (!gone) return false;
  if (!gone_[w].exchange(true, std::memory_order_acq_rel)) {
    TORUS_LOG_DEBUG("ofi: {}", describe_gone(world));
  }
  return true;
}

std::string Engine::describe_gone(int world) const {
  return fmt::format("world rank {} (pid {}) on this host has exited", world, local_pid(world));
}

}  // namespace torus::comm::ofi
