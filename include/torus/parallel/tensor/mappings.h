// torus/parallel/tensor/mappings.h — the region mappings of tensor and
// sequence parallelism, as autograd functions named by the transition they
// make (Megatron-Core's vocabulary).
//
// Layout conventions (Note [TP layouts]):
//  * The TP ("hidden") dimension is the LAST dimension of an activation:
//    column-parallel outputs are split along it.
//  * The sequence dimension of sequence parallelism is dimension 0: models
//    keep activations sequence-first, [s, b, h], so that an all-gather or
//    reduce-scatter along the sequence is one flat collective with no copy.
//  * Splits are even: the split dimension must be divisible by the group size
//    (InvalidArgument otherwise, raised before any communication).
//
//   function                           forward                 backward
//   copy_to_tp_region                  identity                all-reduce
//   reduce_from_tp_region              all-reduce              identity
//   scatter_to_tp_region               split last dim          all-gather last dim
//   gather_from_tp_region              all-gather last dim     split last dim
//   scatter_to_sequence_region         split dim 0             all-gather dim 0
//   gather_from_sequence_region        all-gather dim 0        reduce-scatter dim 0
//                                                              (split when the consumer's
//                                                               gradient is not partial)
//   reduce_scatter_to_sequence_region  reduce-scatter dim 0    all-gather dim 0
//
// A null group or a group of one rank makes every mapping the identity.
// The collectives block the calling thread (forward) or the autograd thread
// (backward); every rank of the group must make the same calls in the same
// order, which an identical model on every rank guarantees. Communication
// errors surface as torus::CommError / TimeoutError.
#pragma once

#include <ATen/core/Tensor.h>

#include "torus/comm/process_group.h"

namespace torus::tp {

at::Tensor copy_to_tp_region(const at::Tensor& x, const comm::ProcessGroupPtr& group);
at::Tensor reduce_from_tp_region(const at::Tensor& x, const comm::ProcessGroupPtr& group);
at::Tensor scatter_to_tp_region(const at::Tensor& x, const comm::ProcessGroupPtr& group);
at::Tensor gather_from_tp_region(const at::Tensor& x, const comm::ProcessGroupPtr& group);

at::Tensor scatter_to_sequence_region(const at::Tensor& x, const comm::ProcessGroupPtr& group);
// `partial_grad`: the gradient arriving from the consumer is a partial sum over
// the group (the consumer is tensor parallel, e.g. a column-parallel linear),
// so backward reduce-scatters; otherwise it only keeps this rank's slice.
at::Tensor gather_from_sequence_region(const at::Tensor& x, const comm::ProcessGroupPtr& group,
                                       bool partial_grad = true);
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const comm::ProcessGroupPtr& group);

// --- plain (non-differentiable) collectives on tensors ------------------------
// Blocking helpers the mappings are built from; also used to gather sharded
// parameters. `dim` may be negative. The result is a new contiguous tensor.
at::Tensor all_gather_along(const at::Tensor& x, int64_t dim, const comm::ProcessGroupPtr& group);
at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, const comm::ProcessGroupPtr& group);
// This rank's block of an even split along `dim` (a view, no communication).
at::Tensor split_along(const at::Tensor& x, int64_t dim, const comm::ProcessGroupPtr& group);
// Sum over the group (in place on a contiguous clone).
at::Tensor all_reduce_sum(const at::Tensor& x, const comm::ProcessGroupPtr& group);

}  // namespace torus::tp
