// torus/optim/clip.h — gradient clipping by a global norm over a sharded,
// pipelined, replicated model.
//
// In a TP x PP x DP layout each rank holds gradients of a part of the model:
// its pipeline stages' parameters, TP shards of some and full copies of
// others, all replicated over DP once the gradients are synchronised. The
// global norm counts every element of the one logical model exactly once:
// each rank sums the squares of the gradients it owns — shards always,
// TP-replicated parameters on TP rank 0 only, copies of a tied weight on one
// stage only (GradNormEntry::counted says which) — and one all-reduce over
// the model-parallel group (pp x tp; DP replicas already agree) adds the
// sums. Every rank then scales all its gradients, counted or not, by the
// same coefficient, so replicas stay identical.
//
//   std::vector<torus::optim::GradNormEntry> entries = ...;
//   auto r = torus::optim::clip_grad_norm(entries, 1.0, mesh.group({"pp", "tp"}));
//   if (!r.finite) { /* skip the step: every rank of the group sees the same */ }
//
// Devices. Gradients may live on the CPU or on CUDA devices (any mix). The
// squares are summed on each gradient's device, in f64 (f32 on devices
// without f64 arithmetic), without copying gradients between devices. The
// one tensor all-reduced lives where the group's backend serves it: on a CUDA
// device (the gradients' device, else the current one) when the group has a
// CUDA device backend (nccl), in f64 when that backend carries f64; else on
// the CPU in f64 (mpi, ofi). Reading the norm synchronises with the device.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "torus/comm/process_group.h"

namespace torus::optim {

struct GradNormEntry {
  at::Tensor param{};   // its .grad is read and scaled (entries without a gradient are skipped)
  bool counted = true;  // does this rank add it to the norm?
  at::Tensor grad{};    // when defined, used instead of param.grad() (e.g. an fp32 main-gradient buffer)
};

struct ClipResult {
  double norm = 0;         // the global L2 norm before clipping
  double coefficient = 1;  // the factor applied (1: not clipped)
  bool finite = true;      // false: the norm is inf or NaN (on every rank of the group); nothing was scaled
};

// The global L2 norm of the counted gradients (squares summed in f64 and
// all-reduced over `group`; a null group is one rank). When max_norm > 0
// and norm > max_norm, scales every entry's gradient (each distinct tensor
// once) in place by max_norm / (norm + 1e-6) (PyTorch's clip_grad_norm_
// rule). Collective over `group`: every rank calls it, with or without
// gradients of its own. Blocks until the norm is known. Throws
// InvalidArgument for a negative or NaN max_norm and for a sparse gradient.
ClipResult clip_grad_norm(const std::vector<GradNormEntry>& entries, double max_norm,
                          const comm::ProcessGroupPtr& group);

}  // namespace torus::optim
