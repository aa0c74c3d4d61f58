// The progress engine (engine.h): construction and teardown, groups,
// submitting, driving (Note [Who drives]) and the op lifecycle (placing,
// stepping, finishing). Failure handling — held provider errors, failing an
// op, breaking a group, deadlines, liveness — is in engine_failure.cpp;
// posting, completions and control messages are in engine_io.cpp; OpCtx (the
// algorithms' view of an op) is in op_ctx.cpp.
#include "comm/ofi/engine.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "comm/ofi/ofi_check.h"
#include "comm/ofi/spin.h"

namespace torus::comm::ofi {

// --- GroupState ------------------------------------------------------------------

bool GroupState::set_broken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.load(std::memory_order_relaxed)) return false;
  reason_ = reason;
  broken_.store(true, std::memory_order_release);
  return true;
}

std::string GroupState::broken_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

// --- OfiWork -----------------------------------------------------------------------

void OfiWork::wait() {
  if (!is_completed()) {
    if (auto e = engine_.lock()) e->drive_until(*this);
  }
  if (is_completed()) {
    rethrow_if_failed();  // finished_ was stored after the outcome
    return;
  }
  Work::wait();
}

void OfiWork::wait(std::chrono::milliseconds timeout) {
  if (auto e = engine_.lock()) {
    if (!e->drive_until(*this, Clock::now() + timeout)) {
      throw TimeoutError(fmt::format("wait() gave up after {} ms on {}; the op is still running", timeout.count(),
                                     info_.describe()));
    }
  }
  Work::wait(timeout);
}

// --- Engine ------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<Fabric> fabric, int world_rank, std::vector<pid_t> local_pids,
               std::vector<int> mark_fds, std::unique_ptr<ProviderMark> mark, EngineOptions options)
    : fabric_(std::move(fabric)),
      world_rank_(world_rank),
      local_pids_(std::move(local_pids)),
      gone_(new std::atomic<bool>[local_pids_.size()]),
      options_(options),
      mark_(std::move(mark)) {
  fabric_->set_mark(mark_.get());
  peers_.reserve(local_pids_.size());
  for (size_t w = 0; w < local_pids_.size(); ++w) {
    gone_[w].store(false, std::memory_order_relaxed);
    const bool local = static_cast<int>(w) != world_rank_ && local_pids_[w] > 0;
    const int fd = w < mark_fds.size() ? mark_fds[w] : -1;
    peers_.emplace_back(local ? local_pids_[w] : 0, local ? fd : -1);
  }
  post_control_recvs();
  thread_ = std::thread([this] { thread_main(); });
}

Engine::~Engine() {
  {
    // Give abort notices a moment to leave: a rank that failed usually tears
    // down right away, and closing the endpoint would drop them. (A wedged
    // endpoint completes nothing any more: Note [Wedged endpoint].)
    std::lock_guard<std::mutex> driver(driver_mu_);
    auto until = Clock::now() + std::chrono::milliseconds(200);
    while (control_sends_ > 0 && !wedged_.load() && Clock::now() < until) {
      retry_posts();
      drain_cq();
      std::this_thread::yield();
    }
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();

  // Read before failing the pending ops below: that failure is not a peer's.
  const bool after_hard_failure = hard_failure_ || wedged_.load();
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> driver(driver_mu_);
    std::vector<std::unique_ptr<Op>> ops;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      ops.swap(incoming_);
      for (auto& g : registered_) groups_.push_back(g);
    }
    for (auto& g : groups_) {
      while (!g->queue.empty()) {
        ops.push_back(std::move(g->queue.front()));
        g->queue.pop_front();
      }
    }
    for (auto& op : p2p_) ops.push_back(std::move(op));
    p2p_.clear();
    for (auto& op : ops) op->group->set_broken("the ofi backend was destroyed");  // nothing to announce
    for (auto& op : ops) {
      fail(*op, std::make_exception_ptr(CommError(fmt::format(
                    "{} failed: the ofi backend was destroyed while the op was pending", op->work->info().describe()))),
           done);
    }
    groups_.clear();
  }
  complete(done);
  if (after_hard_failure) {
    // Note [Teardown after a hard failure]: keep what the provider may
    // still point at, and close nothing.
    TORUS_LOG_DEBUG("ofi: teardown after a hard failure leaves the endpoint open until the process exits");
    struct Kept {
      std::unique_ptr<Fabric> fabric;
      std::vector<MemoryRegion> control_mrs, regs;
      std::vector<std::unique_ptr<Scratch>> scratch;
      std::vector<std::vector<char>> control_bufs;
      std::deque<std::vector<char>> notice_bufs;
    };
    fabric_->abandon_objects();
    new Kept{std::move(fabric_), std::move(control_mrs_), std::move(graveyard_regs_),  // deliberately leaked
             std::move(graveyard_scratch_), std::move(control_bufs_), std::move(notice_bufs_)};
    scratch_pool_.clear();  // idle: no transfer points at it
    return;
  }
  // Closing the endpoint ends every transfer; only then may the memory that
  // pending operations point at go away.
  fabric_->close_endpoint();
  control_mrs_.clear();
  graveyard_scratch_.clear();
  graveyard_regs_.clear();
  scratch_pool_.clear();
  fabric_.reset();
}

bool guards_local_peers(const std::string& provider) {
  return provider == "shm" || provider == "efa" || provider.rfind("shm;", 0) == 0 || provider.rfind("efa;", 0) == 0;
}

pid_t Engine::local_pid(int world) const {
  return world >= 0 && static_cast<size_t>(world) < local_pids_.size() ? local_pids_[world] : 0;
}

void Engine::add_group(const std::shared_ptr<GroupState>& g) {
  std::lock_guard<std::mutex> lock(state_mu_);
  registered_.push_back(g);
  groups_changed_ = true;
  has_incoming_.store(true, std::memory_order_release);
}

void Engine::remove_group(const GroupState* g) {
  std::lock_guard<std::mutex> lock(state_mu_);
  std::erase_if(registered_, [g](const auto& p) { return p.get() == g; });
  groups_changed_ = true;
  has_incoming_.store(true, std::memory_order_release);
}

void Engine::submit(std::unique_ptr<Op> op) {
  if (op->group->broken()) {
    auto work = op->work;
    work->mark_failed(std::make_exception_ptr(
        CommError(fmt::format("{} failed at once: group '{}' is broken: {}", work->info().describe(),
                              op->group->name, op->group->broken_reason()))));
    work->finished_.store(true, std::memory_order_release);
    return;
  }
  outstanding_.fetch_add(1, std::memory_order_relaxed);
  // Fast path: nobody is driving, so this thread places the op itself and
  // runs it up to its first wait (e.g. publishes its data), saving a hand-off.
  if (driver_mu_.try_lock()) {
    thread_local std::vector<Completion> done;
    try {
      absorb_incoming(done);
      place(std::move(op), done);
    } catch (...) {
      driver_mu_.unlock();
      throw;
    }
    driver_mu_.unlock();
    if (!done.empty()) complete(done);
    if (deep_sleep_.load(std::memory_order_acquire)) cv_.notify_one();
    return;
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    incoming_.push_back(std::move(op));
    has_incoming_.store(true, std::memory_order_release);
    wake = deep_sleep_.load(std::memory_order_relaxed);
  }
  if (wake) cv_.notify_one();
}

bool Engine::run_inline(Op& op, const GroupState& group, std::chrono::nanoseconds spin) {
  op.ctx.emplace(*this, op);
  OpCtx& c = *op.ctx;
  c.set_detached();
  c.root = op.make(c);
  c.root.start();  // errors inside the coroutine end it (root.error()); they do not throw here
  auto advance = [&c] {
    while (!c.root.done()) {
      Suspension& s = c.suspension();
      if (s.ready == nullptr || !s.ready(s.arg)) return false;
      auto h = s.resume;
      s.ready = nullptr;
      h.resume();
    }
    return true;
  };
  bool finished = false;
  try {
    finished = spin_politely(wait_policy(Wait::kInline, options_.oversubscribed), spin, advance,
                             [&group] { return group.broken(); });
  } catch (...) {
    return false;  // a wait condition threw (the segment broke): the engine asks again and fails the op
  }
  if (!finished || c.root.error()) return false;
  op.ctx.reset();
  op.work->complete_unshared();  // the caller has not handed it out yet
  return true;
}

bool Engine::drive_until(const OfiWork& work, Clock::time_point until) {
  waiters_.fetch_add(1, std::memory_order_acq_rel);
  thread_local std::vector<Completion> completions;
  Backoff backoff(wait_policy(Wait::kDrive, options_.oversubscribed));
  bool ok = false;
  while (!(ok = work.is_completed())) {
    if (until != Clock::time_point::max() && Clock::now() >= until) break;
    bool progressed = false;
    if (driver_mu_.try_lock()) {
      try {
        progressed = poll_once(completions);
      } catch (...) {
        driver_mu_.unlock();
        waiters_.fetch_sub(1, std::memory_order_acq_rel);
        throw;
      }
      driver_mu_.unlock();
      if (!completions.empty()) complete(completions);
    }
    if (progressed) {
      backoff.reset();
    } else {
      backoff.wait();
    }
  }
  if (waiters_.fetch_sub(1, std::memory_order_acq_rel) == 1 && outstanding_.load(std::memory_order_relaxed) > 0) {
    std::lock_guard<std::mutex> lock(state_mu_);  // no lost wake-up against the engine thread's check
    cv_.notify_one();  // hand driving back to the engine thread
  }
  return ok;
}

void Engine::thread_main() {
  std::vector<Completion> completions;
  auto last_active = Clock::now();
  Backoff backoff(wait_policy(Wait::kDrive, options_.oversubscribed));
  while (true) {
    {
      std::unique_lock<std::mutex> lock(state_mu_);
      if (stop_) break;
      bool work = outstanding_.load(std::memory_order_relaxed) > 0 || !notices_.empty();
      auto now = Clock::now();
      if (work) last_active = now;
      if (!work && now - last_active > options_.idle_to_sleep) {
        deep_sleep_.store(true, std::memory_order_release);
        cv_.wait(lock, [&] { return stop_ || outstanding_.load(std::memory_order_relaxed) > 0 || !notices_.empty(); });
        deep_sleep_.store(false, std::memory_order_release);
        last_active = Clock::now();
        continue;
      }
      if (waiters_.load(std::memory_order_acquire) > 0) {
        // A waiter drives; the last one to leave wakes this thread if ops
        // remain (drive_until), else it looks again within a millisecond.
        cv_.wait_for(lock, std::chrono::milliseconds(1));
        backoff.reset();
        continue;
      }
      if (!work) {
        cv_.wait_for(lock, options_.standby_poll);
        backoff.reset();
        if (!has_incoming_.load(std::memory_order_acquire)) continue;
      }
    }
    bool progressed = false;
    if (driver_mu_.try_lock()) {
      try {
        progressed = poll_once(completions);
      } catch (const std::exception& e) {
        TORUS_LOG_ERROR("ofi: progress engine error: {}", e.what());
      }
      driver_mu_.unlock();
      if (!completions.empty()) complete(completions);
    }
    if (progressed) {
      backoff.reset();
    } else {
      backoff.wait();
    }
  }
}

void Engine::complete(std::vector<Completion>& done) {
  // Callbacks may wait on other ops and so re-enter this thread's driving:
  // work on a private batch, and hand its capacity back afterwards.
  std::vector<Completion> batch;
  batch.swap(done);
  for (auto& c : batch) {
    if (c.error) {
      c.work->mark_failed(c.error);
    } else {
      c.work->mark_completed();
    }
    c.work->finished_.store(true, std::memory_order_release);
  }
  batch.clear();
  if (done.empty()) done.swap(batch);
}

void Engine::absorb_incoming(std::vector<Completion>& done) {
  if (!has_incoming_.load(std::memory_order_acquire)) return;
  std::vector<std::unique_ptr<Op>> in;
  std::vector<std::pair<std::shared_ptr<GroupState>, std::string>> notices;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    in.swap(incoming_);
    notices.swap(notices_);
    has_incoming_.store(false, std::memory_order_relaxed);
    if (groups_changed_) {
      // Keep unregistered groups until their queued ops have drained.
      std::vector<std::shared_ptr<GroupState>> next = registered_;
      for (auto& g : groups_) {
        if (!g->queue.empty() && std::find(next.begin(), next.end(), g) == next.end()) next.push_back(g);
      }
      groups_.swap(next);
      groups_changed_ = false;
    }
  }
  for (auto& [g, reason] : notices) announce(*g, reason);
  for (auto& op : in) place(std::move(op), done);
}

// Queues a collective behind its group's FIFO (starting it when it is the
// head), or starts a point-to-point op at once.
void Engine::place(std::unique_ptr<Op> op, std::vector<Completion>& done) {
  if (!op->collective) {
    p2p_.push_back(std::move(op));
    if (step(*p2p_.back(), done)) p2p_.pop_back();
    return;
  }
  const std::shared_ptr<GroupState>& group = op->group;
  GroupState* g = group.get();
  if (std::find_if(groups_.begin(), groups_.end(), [g](const auto& p) { return p.get() == g; }) == groups_.end()) {
    groups_.push_back(group);
  }
  g->queue.push_back(std::move(op));
  if (g->queue.size() == 1 && step(*g->queue.front(), done)) g->queue.pop_front();
}

bool Engine::poll_once(std::vector<Completion>& done) {
  bool progress = false;
  ++polls_;
  if (has_incoming_.load(std::memory_order_acquire)) {
    absorb_incoming(done);
    progress = true;
  }
  // With nothing posted, the CQ only matters for control messages.
  if (posted_requests_ > 0 || unposted_ > 0 || (polls_ & 63) == 0) progress |= drain_cq();
  if (unposted_ > 0) progress |= retry_posts();

  for (auto& g : groups_) {
    while (!g->queue.empty()) {
      Op& head = *g->queue.front();
      bool finished;
      if (g->broken() && head.ctx) {
        fail(head, std::make_exception_ptr(CommError(fmt::format("{} failed: group '{}' is broken: {}",
                                                                 head.work->info().describe(), g->name,
                                                                 g->broken_reason()))),
             done);
        finished = true;
      } else {
        finished = step(head, done);
      }
      if (!finished) break;
      g->queue.pop_front();
      progress = true;
    }
  }
  for (size_t i = 0; i < p2p_.size();) {
    Op& op = *p2p_[i];
    bool finished;
    if (op.group->broken()) {
      fail(op, std::make_exception_ptr(CommError(fmt::format("{} failed: group '{}' is broken: {}",
                                                             op.work->info().describe(), op.group->name,
                                                             op.group->broken_reason()))),
           done);
      finished = true;
    } else {
      finished = step(op, done);
    }
    if (finished) {
      p2p_[i] = std::move(p2p_.back());
      p2p_.pop_back();
      progress = true;
    } else {
      ++i;
    }
  }
  if ((polls_ & 63) == 0) {
    auto now = Clock::now();
    if (now >= next_deadline_check_) {
      check_deadlines(now, done);
      next_deadline_check_ = now + std::chrono::milliseconds(1);
    }
  }
  return progress || !done.empty();
}

// Starts or resumes `op`; returns true when it finished (either way).
bool Engine::step(Op& op, std::vector<Completion>& done) {
  if (op.held_error) {  // Note [Held provider errors]
    if (Clock::now() < op.hold_until) return false;
    std::exception_ptr e = op.held_error;
    op.held_error = nullptr;
    fail(op, e, done);
    return true;
  }
  try {
    if (!op.ctx) {
      if (op.group->broken()) {
        throw CommError(fmt::format("{} failed at once: group '{}' is broken: {}", op.work->info().describe(),
                                    op.group->name, op.group->broken_reason()));
      }
      op.ctx.emplace(*this, op);
      op.ctx->root = op.make(*op.ctx);
      op.ctx->root.start();
    } else if (!op.ctx->root.done()) {  // done already: it ended in run_inline (with an error)
      Suspension& s = op.ctx->suspension();
      if (s.ready == nullptr || !s.ready(s.arg)) return false;
      auto h = s.resume;
      s.ready = nullptr;
      h.resume();
    }
  } catch (...) {
    return hold_or_fail(op, std::current_exception(), done);
  }
  if (op.ctx->root.done()) {
    std::exception_ptr error = op.ctx->root.error();
    if (error) {
      return hold_or_fail(op, error, done);
    } else {
      finish(op, nullptr, done);
    }
    return true;
  }
  return false;
}

void Engine::finish(Op& op, std::exception_ptr error, std::vector<Completion>& done) {
  op.ctx.reset();
  done.push_back({op.work, error});
  outstanding_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace torus::comm::ofi
