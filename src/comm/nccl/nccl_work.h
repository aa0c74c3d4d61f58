// Private: NcclWork, the stream-ordered Work of one NCCL op (Note
// [Stream-ordered work] in nccl_backend.h).
//
//  * is_completed(): true once the watchdog marked the op, or once its end
//    event has completed (checked through the abort gate, Note [Abort gate]
//    in watchdog.h, so that an aborted op never reads as a success).
//  * wait(): rethrows a failure; otherwise makes the calling thread's current
//    stream on the op's device wait on the end event, without blocking the
//    host. Host-blocking ops (barrier) wait on the host instead.
//  * wait(timeout): blocks the host until completion; TimeoutError after
//    `timeout` (the op itself keeps its own deadline).
#pragma once

#include <chrono>
#include <memory>

#include "comm/nccl/watchdog.h"
#include "torus/comm/work.h"
#include "torus/device/device.h"

namespace torus::comm::nccl {

class NcclWork final : public Work {
 public:
  // Creates the end event on the current CUDA device, which must be `device`.
  NcclWork(WorkInfo info, int device, std::shared_ptr<AbortGate> gate, bool host_blocking_wait);

  device::Event& end_event() { return end_; }
  // The watchdog's completion probe (called under the gate).
  bool device_done() const { return end_.query(); }

  bool is_completed() const override;
  void wait() override;
  void wait(std::chrono::milliseconds timeout) override;

 private:
  // Blocks the host until completion, or until `timeout` when positive.
  void host_wait(std::chrono::milliseconds timeout);
  void rethrow_failure() const;

  int device_;
  std::shared_ptr<AbortGate> gate_;
  bool host_blocking_wait_;
  device::Event end_;
};

}  // namespace torus::comm::nccl
