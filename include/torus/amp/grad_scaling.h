// torus/amp/grad_scaling.h — the gradient side of loss scaling: finding an
// inf/NaN on any rank, and unscaling.
//
// Note [One verdict for all ranks]: a step is skipped on every rank or on
// none, else replicas diverge (DP) or the ranks of one model disagree on
// which update it took (TP, PP). found_non_finite() therefore checks this
// rank's gradients and MAX-reduces the verdict over every group that
// together spans the ranks holding the model's gradients — for a
// TP x PP x DP layout {tp, pp, dp} (one all-reduce of one element each), or
// one group spanning all of them. After ZeRO-2/3 reduce-scatters each rank
// holds only its shard, and the DP group is what makes the verdict global;
// with replicated gradients (DDP) it costs one more all-reduce of 4 bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "torus/comm/process_group.h"

namespace torus::amp {

// True on EVERY rank of the groups when any element of any gradient of any
// of their ranks is inf or NaN. Undefined tensors are skipped; null groups
// and groups of one rank are skipped (no communication). Collective over
// each remaining group in the order given: every rank passes the same
// sequence of groups (the layout's; rank-specific null entries are fine
// only where the group has one rank anyway). The flag travels as one f32
// element on the gradients' device (CUDA for nccl groups, CPU for mpi and
// ofi); `flag_device` names it when this rank has no gradients (a pipeline
// stage without parameters), else it must match them. Reads the result back
// to the host: on CUDA it waits for the backward's kernels. Throws
// InvalidArgument for gradients on different devices or of a non-floating
// dtype.
bool found_non_finite(const std::vector<at::Tensor>& grads, const std::vector<comm::ProcessGroupPtr>& groups,
                      std::optional<c10::Device> flag_device = std::nullopt);
bool found_non_finite(const std::vector<at::Tensor>& grads, const comm::ProcessGroupPtr& group,
                      std::optional<c10::Device> flag_device = std::nullopt);

// grads[i] *= inv_scale, in place, in each gradient's own dtype (the
// product is formed in fp32 or wider and rounded once, so for a power of
// two it is exact unless it underflows). Undefined tensors are skipped.
// Throws InvalidArgument for a non-finite or non-positive inv_scale. No
// communication.
void unscale_(const std::vector<at::Tensor>& grads, double inv_scale);

// The .grad of each parameter (undefined where a parameter has none).
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params);

}  // namespace torus::amp
