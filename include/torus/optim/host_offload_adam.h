// torus/optim/host_offload_adam.h — ZeRO-2 with the optimizer offloaded to
// the host, over flat buffers in any device's memory: the Adam/AdamW step
// for device parameters that LibTorch cannot hold (Neuron; docs/neuron.md),
// free of LibTorch.
//
// Per step, collective over the data-parallel group `dp` (size D):
//   1. the gradients are reduce-scattered (sum) over dp: rank r receives the
//      sum of element range [r*S, (r+1)*S) in a device shard (S = numel / D);
//   2. the shard is copied to the host;
//   3. the CPU Adam kernel (cpu_adam_kernel.h) updates this rank's fp32
//      master weights and moments, with the gradient scaled by
//      grad_scale / D (the mean over ranks, times e.g. an inverse loss scale
//      or a clipping coefficient), and writes the updated shard rounded into
//      the parameters' dtype;
//   4. that shard is copied to the device and all-gathered over dp into the
//      full parameter buffer, so every rank ends with the same parameters.
// Device memory: one gradient shard and one parameter shard (2 S elements)
// besides the caller's buffers; host memory: 3 S fp32 (master, exp_avg,
// exp_avg_sq) and 2 S staging elements. The master weights start from this
// rank's shard of the device parameters at construction.
//
// The buffers are padded: numel must be a multiple of D (padded_numel());
// the padding's gradients should be zero (its parameters then stay as they
// are). Weight decay applies to every element (one parameter group).
// Errors: a non-multiple numel, an unsupported dtype, a backend on another
// device or null buffers throw InvalidArgument at construction; a failing
// collective throws its CommError/TimeoutError from step() (the master
// weights are then left as they were when the gradients could not be
// reduced, and updated when only the final all-gather failed).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "torus/comm/types.h"
#include "torus/core/dtype.h"
#include "torus/optim/cpu_adam_kernel.h"

namespace torus::comm {
class Backend;
}

namespace torus::optim {

struct HostOffloadAdamOptions {
  // lr, betas, eps, weight decay and decoupled (AdamW) of the kernel's
  // hyper-parameters; step, grad_scale and found_inf are set by each step().
  cpu::AdamHyper adam;
  comm::Duration timeout = std::chrono::minutes(10);  // of each collective
  int threads = 0;  // CPU Adam workers (0: all of the pool)
};

class HostOffloadAdam {
 public:
  // params and grads: `numel` elements of `dtype` (f32, bf16 or f16) in the
  // memory of `dp`'s device (dp.device_type()). Not collective.
  HostOffloadAdam(comm::Backend& dp, void* params, void* grads, size_t numel, DType dtype,
                  HostOffloadAdamOptions options = {});
  ~HostOffloadAdam();
  HostOffloadAdam(const HostOffloadAdam&) = delete;
  HostOffloadAdam& operator=(const HostOffloadAdam&) = delete;

  // The smallest multiple of `dp_size` >= numel.
  static size_t padded_numel(size_t numel, int dp_size);

  // One update (collective over dp). `grad_scale` multiplies the mean
  // gradient (1 / loss scale, a clipping coefficient, ...).
  void step(float grad_scale = 1.0f);

  int64_t steps() const { return steps_; }
  size_t shard_numel() const { return shard_; }
  size_t shard_offset() const { return offset_; }  // first element of this rank's shard
  // This rank's host state (shard_numel() floats each).
  const float* master() const { return master_.data(); }
  const float* exp_avg() const { return exp_avg_.data(); }
  const float* exp_avg_sq() const { return exp_avg_sq_.data(); }
  void set_lr(double lr) { options_.adam.lr = lr; }

 private:
  comm::Backend& dp_;
  void* params_;
  void* grads_;
  size_t numel_;
  DType dtype_;
  HostOffloadAdamOptions options_;
  size_t shard_ = 0, offset_ = 0;
  void* dev_grad_shard_ = nullptr;
  void* dev_param_shard_ = nullptr;
  std::vector<float> master_, exp_avg_, exp_avg_sq_;
  std::vector<uint16_t> host_grad16_, host_param16_;  // 16-bit staging (bf16/f16 params)
  std::vector<float> host_grad32_, host_param32_;     // f32 staging
  int64_t steps_ = 0;
};

}  // namespace torus::optim
