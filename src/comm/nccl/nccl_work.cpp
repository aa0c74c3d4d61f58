// NcclWork (nccl_work.h).
#include "comm/nccl/nccl_work.h"

#include <algorithm>

#include "core/log.h"

namespace torus::comm::nccl {

NcclWork::NcclWork(WorkInfo info, int device, std::shared_ptr<AbortGate> gate, bool host_blocking_wait)
    : Work(std::move(info)),
      device_(device),
      gate_(std::move(gate)),
      host_blocking_wait_(host_blocking_wait),
      end_(device::get_device(DeviceType::kCUDA).create_event()) {}

bool NcclWork::is_completed() const {
  if (Work::is_completed()) return true;
  bool done = false;
  try {
    std::lock_guard<std::mutex> gate(gate_->mu);
    if (gate_->broken) return false;  // the watchdog fails it
    done = end_.query();
  } catch (const std::exception&) {
    return false;  // a CUDA error: the watchdog's probe sees it too and fails the op
  }
  if (done) const_cast<NcclWork*>(this)->mark_completed();  // Work is thread safe; finishing twice is a no-op
  return done;
}

void NcclWork::rethrow_failure() const {
  if (std::exception_ptr e = exception()) std::rethrow_exception(e);
}

void NcclWork::wait() {
  if (host_blocking_wait_) {
    host_wait(std::chrono::milliseconds(0));
    return;
  }
  if (!is_completed()) {
    device::Stream caller = device::current_stream(DeviceType::kCUDA, device_);
    caller.wait(end_);
  }
  rethrow_failure();
}

void NcclWork::wait(std::chrono::milliseconds timeout) {
  TORUS_CHECK(timeout.count() > 0, InvalidArgument, "wait(timeout) needs a timeout > 0, got {} ms", timeout.count());
  host_wait(timeout);
}

void NcclWork::host_wait(std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  auto delay = std::chrono::microseconds(10);
  while (!is_completed()) {
    if (timeout.count() > 0 && Clock::now() - start >= timeout) {
      throw TimeoutError(fmt::format("wait() gave up after {} ms on {}; the op is still running", timeout.count(),
                                     info_.describe()));
    }
    // Sleep on the Work's condition variable: the watchdog's mark wakes us at
    // once; otherwise poll the end event again after `delay`.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, delay, [&] { return done_; });
    delay = std::min(delay * 2, std::chrono::microseconds(1000));
  }
  rethrow_failure();
}

}  // namespace torus::comm::nccl
