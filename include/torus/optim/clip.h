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
//   if (!r.finite) { /* skip the step */ }
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "torus/comm/process_group.h"

namespace torus::optim {

struct GradNormEntry {
  at::Tensor param;      // its .grad is read and scaled (parameters without one are skipped)
  bool counted = true;   // does this rank add it to the norm?
};

struct ClipResult {
  double norm = 0;         // the global L2 norm before clipping
  double coefficient = 1;  // the factor applied (1: not clipped)
  bool finite = true;      // false: the norm is inf or NaN; nothing was scaled
};

// The global L2 norm of the counted gradients (squares summed in f64 and
// all-reduced over `group`; a null group is one rank). When max_norm > 0
// and norm > max_norm, scales every entry's gradient by
// max_norm / (norm + 1e-6) (PyTorch's clip_grad_norm_ rule). Collective over
// `group`. Throws InvalidArgument for a negative max_norm.
ClipResult clip_grad_norm(const std::vector<GradNormEntry>& entries, double max_norm,
                          const comm::ProcessGroupPtr& group);

}  // namespace torus::optim
