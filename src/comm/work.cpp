#include "torus/comm/work.h"

#include <atomic>

#include "comm/op_failures.h"
#include "core/log.h"

namespace torus::comm {

std::string WorkInfo::describe() const {
  std::string s = fmt::format("{} seq {} on group '{}' (rank {}/{}, {}, sizes [{}]", op_type_name(op), seq, group,
                              rank, group_size, dtype_name(dtype), fmt::join(sizes, ", "));
  if (peer >= 0) {
    s += fmt::format(", {} {}", (op == OpType::kSend || op == OpType::kRecv) ? "peer" : "root", peer);
  }
  return s + ")";
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

void Work::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
    throw TimeoutError(fmt::format("wait() gave up after {} ms on {}; the op is still running", timeout.count(),
                                   info_.describe()));
  }
  if (error_) std::rethrow_exception(error_);
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

bool Work::succeeded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && !error_;
}

void Work::mark_completed() { finish(nullptr); }
namespace {
std::atomic<uint64_t> failed_ops{0};
}  // namespace

uint64_t failed_ops_in_process() { return failed_ops.load(std::memory_order_relaxed); }

void Work::mark_failed(std::exception_ptr error) {
  failed_ops.fetch_add(1, std::memory_order_relaxed);
  finish(error ? error : std::make_exception_ptr(CommError("failed")));
}

void Work::finish(std::exception_ptr error) {
  std::vector<std::function<void(std::exception_ptr)>> callbacks;
  std::vector<std::shared_ptr<void>> keep;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || finishing_) return;
    finishing_ = true;
    callbacks.swap(callbacks_);
  }
  for (auto& fn : callbacks) {
    try {
      fn(error);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  // Release the op's tensors before any waiter wakes (Note [Work lifetime]):
  // a tensor may own a Python object whose release needs the GIL, which a
  // woken waiter would take back; released here, while every waiter is
  // still blocked (without the GIL), it can always proceed.
  {
    std::lock_guard<std::mutex> lock(mu_);
    releasing_ = true;
    keep.swap(keep_alive_);
  }
  keep.clear();  // outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = error;
  }
  cv_.notify_all();
}

void Work::keep_alive(std::shared_ptr<void> object) {
  std::lock_guard<std::mutex> lock(mu_);
  // Once the op is finishing its buffers are no longer used: `object` is
  // released when this returns.
  if (!done_ && !releasing_) keep_alive_.push_back(std::move(object));
}

void Work::on_complete(std::function<void(std::exception_ptr)> fn) {
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
    err = error_;
  }
  fn(err);
}

WorkPtr make_completed_work(WorkInfo info) {
  auto w = std::make_shared<Work>(std::move(info));
  w->mark_completed();
  return w;
}

}  // namespace torus::comm
