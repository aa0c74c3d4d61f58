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
// Before step 3, the global L2 norm of the mean gradient (times grad_scale)
// is taken over every element and rank (the sum of squares of each shard,
// all-reduced over dp); with max_grad_norm > 0 the gradient is scaled by
// min(1, max_grad_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_
// does. A non-finite norm (an fp16 overflow) skips the update on every rank:
// nothing changes and steps() does not advance.
// Device memory: one gradient shard and one parameter shard (2 S elements)
// besides the caller's buffers; host memory: 3 S fp32 (master, exp_avg,
// exp_avg_sq) and 2 S staging elements. The master weights start from this
// rank's shard of the device parameters at construction.
//
// Parameter groups: disjoint element ranges with their own weight decay and
// learning-rate scale (biases and norms without decay, as usual); elements
// outside every group use the options' weight decay and lr.
//
// The buffers are padded: numel must be a multiple of D (padded_numel());
// the padding's gradients should be zero (its parameters then stay as they
// are).
//
// State: state_dict() hands out this rank's master weights and moments as
// flat host buffers (optim/flat_state.h), each its shard of a global f32
// tensor of numel elements ("optim.master", "optim.exp_avg",
// "optim.exp_avg_sq"), with the step count ("optim.step_count", I64,
// replicated) and the parameters' dtype as meta ("param_dtype"). The
// checkpoint layer saves them in the Torus checkpoint format and reads them
// back on any dp size for which the (padded) element count is the same
// (checkpoint/flat_state.h: verified, agreed over dp, CheckpointError on
// every rank before anything changes); load_state_dict() then takes them
// and rewrites the device parameters from the master weights. No file I/O
// here.
//
// Errors: a non-multiple numel, an unsupported dtype, overlapping or
// out-of-range groups, a backend on another device or null buffers throw
// InvalidArgument at construction; a failing collective throws its
// CommError/TimeoutError from step() (the master weights are then left as
// they were when the gradients could not be reduced, and updated when only
// the final all-gather failed).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "torus/comm/types.h"
#include "torus/core/dtype.h"
#include "torus/optim/cpu_adam_kernel.h"
#include "torus/optim/flat_state.h"

namespace torus::comm {
class Backend;
}

namespace torus::optim {

// Elements [offset, offset + numel) of the flat buffers, with their own
// weight decay and a factor on the learning rate.
struct HostOffloadAdamGroup {
  size_t offset = 0;
  size_t numel = 0;
  double weight_decay = 0.0;
  double lr_scale = 1.0;
};

struct HostOffloadAdamOptions {
  // lr, betas, eps, weight decay and decoupled (AdamW) of the kernel's
  // hyper-parameters; step, grad_scale and found_inf are set by each step().
  cpu::AdamHyper adam;
  std::vector<HostOffloadAdamGroup> groups;  // disjoint; the rest uses `adam`
  double max_grad_norm = 0.0;  // clip the mean gradient to this global L2 norm; 0: no clipping
  comm::Duration timeout = std::chrono::minutes(10);  // of each collective
  int threads = 0;  // CPU Adam workers (0: all of the pool)
};

// What one step did.
struct HostOffloadStep {
  double grad_norm = 0.0;  // global L2 norm of the mean gradient times grad_scale, before clipping
  double clip_coef = 1.0;  // the factor clipping applied (1: none)
  bool skipped = false;    // the norm was not finite: nothing was updated
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
  // gradient (1 / loss scale, ...) before the norm is taken.
  HostOffloadStep step(float grad_scale = 1.0f);

  // This rank's state (see above): views of the live buffers, valid until
  // the next step() or load_state_dict(). Not collective.
  FlatState state_dict() const;
  // Takes a state of the same shape as state_dict()'s (names, dtypes,
  // element ranges, meta: InvalidArgument naming the first difference,
  // before anything changes), then writes the device parameters from the
  // new master weights (collective over dp; a device copy failing on any
  // rank throws Error on every rank, before the all-gather).
  void load_state_dict(const FlatState& state);

  int64_t steps() const { return steps_; }
  size_t shard_numel() const { return shard_; }
  size_t shard_offset() const { return offset_; }  // first element of this rank's shard
  // This rank's host state (shard_numel() floats each).
  const float* master() const { return master_.data(); }
  const float* exp_avg() const { return exp_avg_.data(); }
  const float* exp_avg_sq() const { return exp_avg_sq_.data(); }
  void set_lr(double lr) { options_.adam.lr = lr; }

 private:
  // This rank's shard cut at group boundaries: [begin, end) shard-relative.
  struct Segment {
    size_t begin = 0, end = 0;
    double weight_decay = 0.0, lr_scale = 1.0;
  };
  double grad_sum_squares(const void* host_grad) const;
  float sum_over_dp(float v);  // an f32 sum over dp
  void publish_params();  // master -> host_param (rounded) -> device shard -> all_gather into params_

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
  std::vector<Segment> segments_;
  void* dev_scalar_ = nullptr;  // one f32 for the norm
};

}  // namespace torus::optim
