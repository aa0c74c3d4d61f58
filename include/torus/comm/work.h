// torus/comm/work.h — the handle of one asynchronous communication op.
//
// A Work is created by a Backend when an op is issued and completed by the
// backend's progress engine. It is shared between the caller and the engine
// (std::shared_ptr) and is thread safe.
//
// Note [Work lifetime]: the buffers of an op must stay valid until the op
// completes. ProcessGroup stores the op's tensors in the Work with
// keep_alive(); the backend releases them (release_keep_alive) as soon as the
// op has completed or failed, from the engine thread.
//
// Note [Deadlines]: every op carries a deadline (issue time + its timeout).
// The backend fails a Work that passes its deadline with a TimeoutError that
// names rank, group, op, sequence number and sizes; a group whose op timed out
// is broken, and later ops on it fail at once with a CommError. wait(timeout)
// with a shorter timeout only stops waiting; it does not abort the op.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "torus/comm/types.h"
#include "torus/core/dtype.h"

namespace torus::comm {

// What an op is, for errors, logs and the debug fingerprint.
struct WorkInfo {
  uint64_t seq = 0;          // per-group sequence number, from 1
  OpType op = OpType::kBarrier;
  std::string group;         // group name, e.g. "world", "tp"
  int rank = -1;             // rank within the group
  int group_size = 0;
  DType dtype = DType::kF32;
  std::vector<int64_t> sizes;  // element counts (op specific: input/output)
  int peer = -1;             // root for broadcast/reduce, peer for send/recv

  // "all_reduce seq 7 on group 'tp' (rank 1/2, f32, sizes [1024])"
  std::string describe() const;
};

class Work {
 public:
  explicit Work(WorkInfo info) : info_(std::move(info)) {}
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // True once the op finished, successfully or not. Never blocks.
  virtual bool is_completed() const;

  // Host backends: blocks until the op completes. Throws the op's exception
  // if it failed (TimeoutError past its deadline, CommError on transport
  // failure). Equivalent to: while (!is_completed()) sleep; rethrow exception().
  // Device backends (nccl) are stream ordered (Note [Stream order] in
  // process_group.cpp): wait() makes the caller's current stream wait for the
  // op's end event and returns without blocking the host; wait(timeout)
  // blocks the host.
  virtual void wait();

  // As wait(), but gives up after `timeout`, throwing TimeoutError; the op
  // itself keeps its own deadline and is not aborted by this.
  virtual void wait(std::chrono::milliseconds timeout);

  // The op's failure, or nullptr while running or after success.
  std::exception_ptr exception() const;
  bool succeeded() const;

  const WorkInfo& info() const { return info_; }

  // --- backend side -------------------------------------------------------------
  // Exactly one of these is called once. They run completion callbacks,
  // release keep-alive objects, then wake waiters.
  void mark_completed();
  void mark_failed(std::exception_ptr error);

  // Holds `object` until the op completes (Note [Work lifetime]).
  void keep_alive(std::shared_ptr<void> object);

  // Registers `fn` to run when the op finishes, in the completing thread,
  // before keep-alive objects are released and waiters wake; runs it at
  // once if the Work is already complete. Used by backends for
  // post-processing (e.g. casting an f32 staging buffer back to bf16). `fn`
  // receives the op's exception (nullptr on success); if it throws, the Work
  // fails with that exception.
  void on_complete(std::function<void(std::exception_ptr)> fn);

 protected:
  void finish(std::exception_ptr error);

  WorkInfo info_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::vector<std::shared_ptr<void>> keep_alive_;
  bool finishing_ = false;  // finish() has begun (a second call returns at once)
  bool releasing_ = false;  // finish() has taken the keep-alive objects
  std::vector<std::function<void(std::exception_ptr)>> callbacks_;
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that is complete at creation (ops that need no communication, e.g.
// on a group of one rank).
WorkPtr make_completed_work(WorkInfo info);

}  // namespace torus::comm
