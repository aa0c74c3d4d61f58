// torus/parallel/tensor/cross_entropy.h — cross entropy over logits whose
// vocabulary dimension is split over TP, without gathering the logits.
//
// Each rank holds logits[..., r*V/tp : (r+1)*V/tp] of the padded vocabulary.
// Forward: the max over the vocabulary (all-reduce MAX), then one all-reduce
// SUM of the exp-sum and of the target logit (each target lives on exactly one
// rank). Backward needs no communication: d loss / d logits = softmax - onehot
// on the local slice. Columns at or beyond `vocab_size` (padding) are
// excluded: their probability is zero and they receive zero gradient, so
// padding never changes the loss.
//
// Communication: two all-reduces over `tp` in forward, none in backward.
// With one TP rank it is ATen's fused cross entropy on the unpadded columns.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "torus/comm/process_group.h"

namespace torus::tp {

struct VocabParallelCrossEntropyOptions {
  int64_t vocab_size = -1;      // unpadded global vocabulary; -1: no padding (= local size * tp)
  int64_t ignore_index = -100;  // targets equal to it get loss 0 and no gradient
};

// logits [..., V/tp] (floating), targets [...] (int64). Returns the per-token
// loss [...] in fp32 (f64 for f64 logits): bf16/f16 logits are upcast inside,
// every statistic is fp32, and the gradient w.r.t. the logits comes back in
// the logits' dtype (Note [Cross entropy in fp32]). Throws InvalidArgument on mismatched shapes
// or a vocabulary larger than the padded one, before any communication.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        const comm::ProcessGroupPtr& tp,
                                        const VocabParallelCrossEntropyOptions& options = {});

}  // namespace torus::tp
