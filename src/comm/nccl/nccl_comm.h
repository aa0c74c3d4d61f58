// Private: NcclComm, the RAII owner of one non-blocking NCCL communicator.
//
// Every NCCL call that takes the communicator goes through call() under one
// mutex, and abort() takes the same mutex, so ncclCommAbort never races with
// another call on the same handle; after abort() the handle is never used
// again (not even to destroy it). Non-blocking calls return promptly, so an
// abort waits at most for one enqueue. State polling (wait_ready) releases
// the mutex between polls and stops when an abort is requested.
//
// Destruction: a communicator that was aborted is left alone; a healthy one
// is finalised (ncclCommFinalize, polled up to the shutdown timeout) and
// destroyed, or aborted if finalising does not finish in time.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "comm/nccl/watchdog.h"

namespace torus::comm::nccl {

class NcclComm {
 public:
  enum class Status { kReady, kError, kTimeout, kAborted };
  struct Readiness {
    Status status = Status::kReady;
    std::string error;  // for kError
  };

  // ncclCommInitRankConfig (blocking = 0) on CUDA device `device`, then
  // waits until the communicator is ready. On failure the half-built
  // communicator is aborted and TimeoutError (ranks missing at `deadline`) or
  // CommError is thrown. `name` names the communicator in messages.
  static std::unique_ptr<NcclComm> init(const ncclUniqueId& id, int nranks, int rank, int device,
                                        const std::string& name, Clock::time_point deadline);

  // ncclCommSplit (collective over this communicator); nullptr for color < 0.
  // Waits until this communicator and the new one are ready. Throws as init
  // does; on failure both communicators are aborted.
  std::unique_ptr<NcclComm> split(int color, int key, const std::string& name, Clock::time_point deadline);

  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Runs fn(ncclComm_t) under the call mutex and returns its result. Throws
  // CommError if the communicator was aborted.
  template <typename Fn>
  ncclResult_t call(Fn&& fn) {
    std::lock_guard<std::mutex> lock(call_mu_);
    throw_if_aborted();
    return fn(comm_);
  }

  // Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress,
  // `deadline` passes, or an abort is requested.
  Readiness wait_ready(Clock::time_point deadline);

  // The asynchronous error as text, "" while healthy (or in progress).
  std::string async_error();

  // ncclCommAbort, once. Thread safe; never throws.
  void abort();
  bool aborted() const { return abort_requested_.load(); }

  int device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  void set_shutdown_timeout(std::chrono::milliseconds t) { shutdown_timeout_ = t; }

 private:
  NcclComm(int device, int rank, int size, std::string name)
      : device_(device), rank_(rank), size_(size), name_(std::move(name)) {}
  void throw_if_aborted() const;
  // Waits for readiness and throws the right error (aborting this comm).
  void wait_or_throw(Clock::time_point deadline, const char* what);

  ncclComm_t comm_ = nullptr;
  int device_;
  int rank_;
  int size_;
  std::string name_;
  std::chrono::milliseconds shutdown_timeout_{30000};
  std::mutex call_mu_;
  std::atomic<bool> abort_requested_{false};
  bool aborted_ = false;  // under call_mu_
};

}  // namespace torus::comm::nccl
