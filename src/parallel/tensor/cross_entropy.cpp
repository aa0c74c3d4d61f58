// Vocab-parallel cross entropy (cross_entropy.h): softmax statistics are
// combined over TP with two all-reduces; the logits are never gathered.
#include "torus/parallel/tensor/cross_entropy.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Reduction.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>

#include "core/log.h"
#include "parallel/tensor/group_capsule.h"
#include "torus/parallel/groups.h"

namespace torus::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Note [Cross entropy in fp32]: half-precision logits are upcast here. The
// max, the exp-sum over the vocabulary (a sum of up to V terms), its log and
// the target logit are fp32, so is the per-token loss; the only rounding to
// the logits' dtype is that of the gradient handed back.
at::ScalarType compute_dtype(at::ScalarType logits) {
  return logits == at::kDouble ? at::kDouble : at::kFloat;
}

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  // logits [T, local]; targets [T]. Returns the loss [T].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            const comm::ProcessGroupPtr& g, int64_t vocab_size, int64_t ignore_index) {
    const int64_t local = logits.size(1);
    const int64_t start = parallel::group_rank(g) * local;
    // Columns at or past vocab_size are padding: they take no part at all.
    const int64_t valid = std::clamp<int64_t>(vocab_size - start, 0, local);
    const auto acc = logits.options().dtype(compute_dtype(logits.scalar_type()));
    const at::Tensor v = logits.narrow(1, 0, valid).to(acc.dtype());  // Note [Cross entropy in fp32]

    at::Tensor max = valid > 0 ? std::get<0>(v.max(1))
                               : at::full({logits.size(0)}, -std::numeric_limits<double>::infinity(), acc);
    if (parallel::group_size(g) > 1) g->all_reduce(max, {.op = comm::ReduceOp::kMax})->wait();

    at::Tensor exp = (v - max.unsqueeze(1)).exp_();  // one temporary, exponentiated in place
    at::Tensor in_range = (targets >= start).logical_and_(targets < start + valid);
    at::Tensor local_target =
        (targets - start).clamp_(0, std::max<int64_t>(valid - 1, 0)).masked_fill_(in_range.logical_not(), 0);
    at::Tensor target_logit =
        valid > 0 ? (v.gather(1, local_target.unsqueeze(1)).squeeze(1) - max) * in_range.to(v.scalar_type())
                  : at::zeros({logits.size(0)}, acc);
    // One all-reduce for both sums: [exp-sum; target logit].
    at::Tensor sums = at::stack({exp.sum(1), target_logit});
    if (parallel::group_size(g) > 1) g->all_reduce(sums)->wait();
    at::Tensor sum_exp = sums[0];
    at::Tensor keep = targets.ne(ignore_index);
    at::Tensor loss = (sum_exp.log() - sums[1]).mul_(keep.to(v.scalar_type()));

    exp.div_(sum_exp.unsqueeze(1));  // softmax over the valid columns
    ctx->save_for_backward({exp, local_target, in_range, keep});
    ctx->saved_data["local"] = local;
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local_target = saved[1];
    const at::Tensor& in_range = saved[2];
    const at::Tensor& keep = saved[3];
    const int64_t local = ctx->saved_data["local"].toInt();
    const int64_t valid = softmax.size(1);

    // d loss_t / d logit_tj = (softmax_tj - [j == target_t]) * grad_t, zero for ignored tokens.
    at::Tensor scale = grads[0] * keep.to(grads[0].scalar_type());
    at::Tensor grad = softmax * scale.unsqueeze(1);
    if (valid > 0) {
      grad.scatter_add_(1, local_target.unsqueeze(1), (-scale * in_range.to(scale.scalar_type())).unsqueeze(1));
    }
    if (valid < local) grad = at::constant_pad_nd(grad, {0, local - valid});
    grad = grad.to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt()));  // rounded once
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        const comm::ProcessGroupPtr& tp,
                                        const VocabParallelCrossEntropyOptions& options) {
  TORUS_CHECK(logits.defined() && targets.defined(), InvalidArgument, "vocab_parallel_cross_entropy: undefined input");
  TORUS_CHECK(at::isFloatingType(logits.scalar_type()), InvalidArgument,
              "vocab_parallel_cross_entropy: logits must be floating point, got {}",
              c10::toString(logits.scalar_type()));
  TORUS_CHECK(targets.scalar_type() == at::kLong, InvalidArgument,
              "vocab_parallel_cross_entropy: targets must be int64, got {}", c10::toString(targets.scalar_type()));
  TORUS_CHECK(logits.dim() == targets.dim() + 1 && logits.sizes().slice(0, targets.dim()) == targets.sizes(),
              InvalidArgument,
              "vocab_parallel_cross_entropy: logits [{}] do not match targets [{}] (expected [targets..., V/tp])",
              fmt::join(logits.sizes(), ", "), fmt::join(targets.sizes(), ", "));
  const int64_t local = logits.size(-1);
  const int64_t padded = local * parallel::group_size(tp);
  const int64_t vocab = options.vocab_size < 0 ? padded : options.vocab_size;
  TORUS_CHECK(vocab >= 1 && vocab <= padded, InvalidArgument,
              "vocab_parallel_cross_entropy: vocab_size {} does not fit the {} logit columns over {} TP ranks", vocab,
              padded, parallel::group_size(tp));
  at::Tensor flat_targets = targets.reshape({-1});
  if (flat_targets.device().is_cpu() && flat_targets.numel() > 0) {
    // A target outside the vocabulary would silently score as "no target";
    // checked on CPU only, where it costs no device synchronisation.
    at::Tensor bad =
        flat_targets.ne(options.ignore_index).logical_and_(flat_targets.lt(0).logical_or_(flat_targets.ge(vocab)));
    TORUS_CHECK(!bad.any().item<bool>(), InvalidArgument,
                "vocab_parallel_cross_entropy: a target is outside [0, {}) and is not ignore_index {}", vocab,
                options.ignore_index);
  }
  if (parallel::group_size(tp) == 1) {
    // The whole vocabulary is here: ATen's fused log-softmax + NLL (two
    // passes over the logits each way, against five for the statistics
    // below). Padding columns are cut off first, so they get no probability
    // and a zero gradient, exactly as in the TP path.
    at::Tensor v = logits.reshape({-1, local});
    if (vocab < local) v = v.narrow(1, 0, vocab);
    // Note [Cross entropy in fp32]; the cast's backward rounds the gradient
    // to the logits' dtype.
    v = v.to(compute_dtype(v.scalar_type()));
    at::Tensor loss = at::cross_entropy_loss(v, flat_targets, std::nullopt, at::Reduction::None, options.ignore_index);
    return loss.view(targets.sizes());
  }
  at::Tensor loss =
      VocabParallelCrossEntropy::apply(logits.reshape({-1, local}), flat_targets, tp, vocab, options.ignore_index);
  return loss.view(targets.sizes());
}

}  // namespace torus::tp
