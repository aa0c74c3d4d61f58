// The NCCL watchdog policy (watchdog.h): completion, deadlines, asynchronous
// errors, and the single abort of a broken group.
#include "comm/nccl/watchdog.h"

#include <algorithm>
#include <utility>

#include "core/log.h"

namespace torus::comm::nccl {

Watchdog::Watchdog(WatchdogHooks hooks, Options options) : hooks_(std::move(hooks)), options_(std::move(options)) {
  if (options_.start_thread) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_) {
    stop_cv_.wait_for(lock, options_.poll_interval, [&] { return stop_; });
    if (stop_) break;
    lock.unlock();
    poll();
    lock.lock();
  }
}

void Watchdog::track(std::shared_ptr<Work> work, std::function<bool()> probe, Clock::time_point deadline) {
  std::string reason;
  {
    std::lock_guard<std::mutex> gate(gate_->mu);
    std::lock_guard<std::mutex> lock(mu_);
    if (!gate_->broken) {
      entries_.push_back(Entry{std::move(work), std::move(probe), hooks_.now(), deadline});
      return;
    }
    reason = reason_;
  }
  work->mark_failed(std::make_exception_ptr(CommError(fmt::format(
      "{} failed at once: group '{}' is broken ({})", work->info().describe(), options_.group, reason))));
}

void Watchdog::poll() {
  std::lock_guard<std::mutex> one_at_a_time(poll_mu_);
  std::vector<std::shared_ptr<Work>> completed;
  std::shared_ptr<Work> probe_failed;
  std::exception_ptr probe_error;
  std::string probe_what;
  {
    std::lock_guard<std::mutex> gate(gate_->mu);
    if (gate_->broken) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      bool done = false;
      try {
        done = it->probe();
      } catch (const std::exception& e) {
        probe_failed = it->work;
        probe_error = std::current_exception();
        probe_what = e.what();
        break;
      }
      if (done) {
        completed.push_back(std::move(it->work));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : completed) w->mark_completed();  // outside every lock: runs callbacks, releases tensors
  completed.clear();

  if (probe_failed) {
    break_group(fmt::format("querying the completion of {} failed: {}", probe_failed->info().describe(), probe_what),
                probe_failed, probe_error, nullptr);
    return;
  }

  std::string async;
  try {
    if (hooks_.async_error) async = hooks_.async_error();
  } catch (const std::exception& e) {
    async = e.what();
  }
  if (!async.empty()) {
    break_group(fmt::format("NCCL reported an asynchronous error on group '{}' (rank {}): {}; a peer process has "
                            "likely failed or the network broke",
                            options_.group, options_.rank, async),
                nullptr, nullptr, nullptr);
    return;
  }

  std::shared_ptr<Work> late;
  std::chrono::milliseconds allowed{0};
  {
    Clock::time_point now = hooks_.now();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return now >= e.deadline; });
    if (it != entries_.end()) {
      late = it->work;
      allowed = std::chrono::duration_cast<std::chrono::milliseconds>(it->deadline - it->issued);
    }
  }
  if (late) {
    std::string what = fmt::format(
        "{} did not complete within its timeout of {} ms; the communicator was aborted. Usual causes: a rank that "
        "did not issue the same op (op order differs across ranks), a rank that died or hangs, or a stalled network",
        late->info().describe(), allowed.count());
    break_group(what, late, std::make_exception_ptr(TimeoutError(what)), nullptr);
  }
}

void Watchdog::abort(const std::string& reason, std::exception_ptr error) {
  break_group(reason, nullptr, nullptr, std::move(error));
}

void Watchdog::break_group(const std::string& reason, const std::shared_ptr<Work>& primary,
                           std::exception_ptr primary_error, std::exception_ptr others_error) {
  {
    std::lock_guard<std::mutex> gate(gate_->mu);
    if (gate_->broken) return;
    gate_->broken = true;  // Note [Abort gate]: closed before the abort
    std::lock_guard<std::mutex> lock(mu_);
    reason_ = reason;
  }
  TORUS_LOG_ERROR("nccl: group '{}' (rank {}) is broken: {}", options_.group, options_.rank, reason);
  try {
    if (hooks_.abort) hooks_.abort(reason);
  } catch (const std::exception& e) {
    TORUS_LOG_ERROR("nccl: aborting the communicator of group '{}' failed: {}", options_.group, e.what());
  }
  std::vector<Entry> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(entries_);
  }
  for (Entry& e : pending) {
    if (e.work == primary && primary_error) {
      e.work->mark_failed(primary_error);
    } else if (others_error) {
      e.work->mark_failed(others_error);
    } else {
      e.work->mark_failed(std::make_exception_ptr(CommError(fmt::format(
          "{} failed: group '{}' was aborted: {}", e.work->info().describe(), options_.group, reason))));
    }
  }
}

bool Watchdog::drain(std::chrono::milliseconds timeout) {
  const Clock::time_point end = Clock::now() + timeout;
  for (;;) {
    poll();
    if (in_flight() == 0) return true;
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool Watchdog::broken() const {
  std::lock_guard<std::mutex> gate(gate_->mu);
  return gate_->broken;
}

std::string Watchdog::broken_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

size_t Watchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace torus::comm::nccl
