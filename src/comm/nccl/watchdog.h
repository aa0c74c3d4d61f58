// Private: the watchdog of one NCCL communicator — the policy that completes,
// times out and aborts stream-ordered ops. Shared with the neuron backend
// (src/comm/neuron), whose ops complete asynchronously in the same way. Free of CUDA and NCCL: the backend
// plugs them in through hooks (a completion probe per op; the communicator's
// asynchronous error and abort), so the policy is tested on any machine with
// fake hooks and an injected clock.
//
// Policy, on every poll (a background thread polls every poll_interval):
//  1. ops whose probe reports completion are marked completed (their
//     keep-alive objects are released), in any order;
//  2. an asynchronous communicator error (a peer failed, the network broke)
//     breaks the group: the communicator is aborted, then every op still in
//     flight fails with CommError;
//  3. otherwise the first op past its deadline breaks the group: abort, then
//     that op fails with TimeoutError (naming rank, group, op, sequence number
//     and sizes) and the others with CommError.
// The abort hook runs at most once and always before the ops fail, so that
// no buffer is released while the device may still write to it. A broken
// group stays broken: later ops fail at once (the backend refuses to issue).
//
// Note [Abort gate]: an aborted communicator lets its kernels exit early, so
// an op's end event may complete without the op having happened. Completion
// probes therefore run under gate().mu and only while gate().broken is false;
// the gate is closed (broken = true) under the same mutex before the abort
// hook runs. A completion observed through the gate happened before any
// abort. NcclWork::is_completed() uses the same gate.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "torus/comm/work.h"

namespace torus::comm::nccl {

using Clock = std::chrono::steady_clock;

struct AbortGate {
  std::mutex mu;
  bool broken = false;
};

struct WatchdogHooks {
  // The communicator's asynchronous error as text, or "" when healthy.
  std::function<std::string()> async_error;
  // Aborts the communicator (never destroys it). Called at most once.
  std::function<void(const std::string& reason)> abort;
  // The clock deadlines are measured with (injectable for tests).
  std::function<Clock::time_point()> now = [] { return Clock::now(); };
};

class Watchdog {
 public:
  struct Options {
    std::string group;  // group name, for messages
    int rank = 0;
    std::chrono::milliseconds poll_interval{10};
    bool start_thread = true;  // false: the owner calls poll() (tests)
  };

  Watchdog(WatchdogHooks hooks, Options options);
  // Stops the thread. Ops still in flight stay pending: call drain() or
  // abort() first.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Tracks `work` until `probe` (non-blocking, called under the gate) returns
  // true, or `deadline` passes. A work given to a broken group fails at once.
  void track(std::shared_ptr<Work> work, std::function<bool()> probe, Clock::time_point deadline);

  // One sweep of the policy above. Thread safe; never throws.
  void poll();

  // Breaks the group for `reason` (a user abort or a failed issue): aborts
  // the communicator and fails every op in flight with `error` (CommError
  // naming the reason when null). Idempotent: only the first call acts.
  void abort(const std::string& reason, std::exception_ptr error = nullptr);

  // Polls until no op is in flight or `timeout` passes; returns whether
  // everything completed.
  bool drain(std::chrono::milliseconds timeout);

  // True when called from the watchdog's own thread (completion callbacks
  // run there).
  bool on_watchdog_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

  bool broken() const;
  std::string broken_reason() const;
  size_t in_flight() const;
  const std::shared_ptr<AbortGate>& gate() const { return gate_; }

 private:
  struct Entry {
    std::shared_ptr<Work> work;
    std::function<bool()> probe;
    Clock::time_point issued;
    Clock::time_point deadline;
  };

  void run();
  // Breaks the group (once): closes the gate, aborts, then fails the ops in
  // flight — `primary` with `primary_error`, the others with `others_error`
  // or, when that is null, a CommError naming `reason`.
  void break_group(const std::string& reason, const std::shared_ptr<Work>& primary, std::exception_ptr primary_error,
                   std::exception_ptr others_error);

  WatchdogHooks hooks_;
  Options options_;
  std::shared_ptr<AbortGate> gate_ = std::make_shared<AbortGate>();

  mutable std::mutex mu_;  // guards entries_, reason_; never held while calling hooks or completing works
  std::vector<Entry> entries_;
  std::string reason_;

  std::mutex poll_mu_;  // one poll at a time
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace torus::comm::nccl
