// Tensor-parallel layers (layers.h): the functional forms compose the region
// mappings with local ATen ops; the modules own layout-independent shards.
#include "torus/parallel/tensor/layers.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <torch/csrc/autograd/custom_function.h>

#include "core/log.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/mappings.h"
#include "torus/parallel/tensor/random.h"
#include "torus/parallel/tensor/weight_grad.h"

namespace torus::tp {
namespace {

using parallel::group_rank;
using parallel::group_size;

void check_features(const at::Tensor& x, const at::Tensor& weight, const char* layer) {
  TORUS_CHECK(x.defined() && weight.defined(), InvalidArgument, "{}: undefined input or weight", layer);
  TORUS_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1), InvalidArgument,
              "{}: input [{}] does not match the local weight [{}] (last input dimension must be {})", layer,
              fmt::join(x.sizes(), ", "), fmt::join(weight.sizes(), ", "), weight.dim() == 2 ? weight.size(1) : -1);
}

void check_sequence(const at::Tensor& y, const comm::ProcessGroupPtr& tp, const char* layer) {
  TORUS_CHECK(y.dim() >= 1 && y.size(0) % group_size(tp) == 0, InvalidArgument,
              "{}: sequence parallelism needs the sequence (dimension 0, size {}) divisible by the TP size {}", layer,
              y.dim() >= 1 ? y.size(0) : 0, group_size(tp));
}

int64_t divided(int64_t size, const comm::ProcessGroupPtr& tp, const char* what, const char* layer) {
  const int n = group_size(tp);
  TORUS_CHECK(size >= 1, InvalidArgument, "{}: {} must be >= 1, got {}", layer, what, size);
  TORUS_CHECK(size % n == 0, InvalidArgument, "{}: {} ({}) is not divisible by the tensor-parallel size {}", layer,
              what, size, n);
  return size / n;
}

InitSpec normal(const ParamInit& init, std::string_view name) {
  return {InitSpec::Kind::kNormal, init.std, derive_seed(init.seed, name)};
}
bool is_reduced_float(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

// Note [Embedding gradient in fp32]: the gradient of a table row is the sum
// of the output gradients of every token that looked it up — thousands of
// terms for a frequent token. ATen's CPU kernel accumulates it in the
// table's dtype, which for bf16 loses whole percents; this lookup sums in
// fp32 (ATen's own dense backward on fp32 gradients: deterministic, on CPU
// and CUDA) and rounds the result once. Used for bf16/f16 tables only.
struct HalfEmbedding : torch::autograd::Function<HalfEmbedding> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& weight,
                            const at::Tensor& indices) {
    ctx->save_for_backward({indices});
    ctx->saved_data["rows"] = weight.size(0);
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.scalar_type());
    return at::embedding(weight, indices);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    at::Tensor dw = at::embedding_dense_backward(grads[0].to(at::kFloat), indices, ctx->saved_data["rows"].toInt(),
                                                 /*padding_idx=*/-1, /*scale_grad_by_freq=*/false);
    return {dw.to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt())), at::Tensor()};
  }
};

at::Tensor embedding_lookup(const at::Tensor& weight, const at::Tensor& indices) {
  return is_reduced_float(weight) ? HalfEmbedding::apply(weight, indices) : at::embedding(weight, indices);
}

constexpr InitSpec kZeros{InitSpec::Kind::kZeros, 0.0, 0};
constexpr InitSpec kOnes{InitSpec::Kind::kOnes, 0.0, 0};

}  // namespace

// --- functional forms -----------------------------------------------------------

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  const comm::ProcessGroupPtr& tp, const ColumnParallelOptions& options) {
  check_features(x, weight, "column_parallel_linear");
  at::Tensor input =
      options.sequence_parallel ? gather_from_sequence_region(x, tp, /*partial_grad=*/true) : copy_to_tp_region(x, tp);
  at::Tensor y = tp::linear(input, weight, bias);  // Note [Deferred weight gradients]
  return options.gather_output ? gather_from_tp_region(y, tp) : y;
}

at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               const comm::ProcessGroupPtr& tp, const RowParallelOptions& options) {
  TORUS_CHECK(x.defined() && weight.defined(), InvalidArgument, "row_parallel_linear: undefined input or weight");
  if (!options.input_is_parallel) {
    TORUS_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1) * group_size(tp), InvalidArgument,
                "row_parallel_linear: replicated input [{}] must have {} x {} features", fmt::join(x.sizes(), ", "),
                group_size(tp), weight.size(1));
  }
  at::Tensor input = options.input_is_parallel ? x : scatter_to_tp_region(x, tp);
  check_features(input, weight, "row_parallel_linear");
  if (group_size(tp) == 1) {
    // Nothing to reduce: the bias joins the GEMM (one addmm instead of mm + add).
    return tp::linear(input, weight, bias);
  }
  at::Tensor partial = tp::linear(input, weight);
  at::Tensor y;
  if (options.sequence_parallel) {
    check_sequence(partial, tp, "row_parallel_linear");
    y = reduce_scatter_to_sequence_region(partial, tp);
  } else {
    y = reduce_from_tp_region(partial, tp);
  }
  return bias.defined() ? y + bias : y;
}

at::Tensor vocab_parallel_embedding(const at::Tensor& tokens, const at::Tensor& weight, const comm::ProcessGroupPtr& tp,
                                    bool reduce_scatter_output) {
  TORUS_CHECK(tokens.defined() && tokens.scalar_type() == at::kLong, InvalidArgument,
              "vocab_parallel_embedding: tokens must be an int64 tensor");
  TORUS_CHECK(weight.defined() && weight.dim() == 2, InvalidArgument,
              "vocab_parallel_embedding: weight must be [vocab/tp, h]");
  if (reduce_scatter_output) {
    TORUS_CHECK(tokens.dim() >= 1 && tokens.size(0) % group_size(tp) == 0, InvalidArgument,
                "vocab_parallel_embedding: sequence parallelism needs the sequence (dimension 0 of the tokens, size "
                "{}) divisible by the TP size {}",
                tokens.dim() >= 1 ? tokens.size(0) : 0, group_size(tp));
  }
  if (group_size(tp) == 1) return embedding_lookup(weight, tokens);
  const int64_t local = weight.size(0);
  const int64_t start = group_rank(tp) * local;
  // Tokens owned by other ranks look up row 0 and are zeroed: the sum over
  // ranks then holds exactly one real row per token.
  at::Tensor outside = tokens.lt(start).logical_or_(tokens.ge(start + local));
  at::Tensor rows = embedding_lookup(weight, (tokens - start).masked_fill_(outside, 0));
  at::Tensor partial = rows.masked_fill(outside.unsqueeze(-1), 0);
  return reduce_scatter_output ? reduce_scatter_to_sequence_region(partial, tp) : reduce_from_tp_region(partial, tp);
}

// --- ColumnParallelLinear ------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(const ColumnParallelLinearOptions& options, comm::ProcessGroupPtr tp)
    : options_(options), tp_(std::move(tp)) {
  const char* name = "ColumnParallelLinear";
  divided(options.in_features, nullptr, "in_features", name);
  divided(options.out_features, tp_, "out_features", name);
  const int r = group_rank(tp_), n = group_size(tp_);
  weight_ =
      register_parameter("weight", init_shard({options.out_features, options.in_features}, {0}, options.out_features,
                                              normal(options.init, "weight"), r, n, options.tensor_options));
  if (options.bias) {
    bias_ = register_parameter(
        "bias", init_shard({options.out_features}, {0}, options.out_features, kZeros, r, n, options.tensor_options));
  }
}

at::Tensor ColumnParallelLinear::forward(const at::Tensor& x) {
  return column_parallel_linear(x, weight_, bias_, tp_, {options_.gather_output, options_.sequence_parallel});
}

ShardSpecs ColumnParallelLinear::shard_specs() const {
  ShardSpecs s{{"weight", {0}}};
  if (bias_.defined()) s["bias"] = {0};
  return s;
}

// --- RowParallelLinear -------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(const RowParallelLinearOptions& options, comm::ProcessGroupPtr tp)
    : options_(options), tp_(std::move(tp)) {
  const char* name = "RowParallelLinear";
  divided(options.in_features, tp_, "in_features", name);
  divided(options.out_features, nullptr, "out_features", name);
  const int r = group_rank(tp_), n = group_size(tp_);
  weight_ =
      register_parameter("weight", init_shard({options.out_features, options.in_features}, {1}, options.in_features,
                                              normal(options.init, "weight"), r, n, options.tensor_options));
  if (options.bias) {
    bias_ = register_parameter("bias", init_shard({options.out_features}, {}, 0, kZeros, r, n, options.tensor_options));
  }
}

at::Tensor RowParallelLinear::forward(const at::Tensor& x) {
  return row_parallel_linear(x, weight_, bias_, tp_, {options_.input_is_parallel, options_.sequence_parallel});
}

ShardSpecs RowParallelLinear::shard_specs() const {
  ShardSpecs s{{"weight", {1}}};
  // Under sequence parallelism the bias is added to this rank's slice of the
  // sequence only: its gradient is partial over TP.
  if (bias_.defined()) s["bias"] = {.tp_partial_grad = options_.sequence_parallel};
  return s;
}

// --- VocabParallelEmbedding -------------------------------------------------------------

VocabParallelEmbedding::VocabParallelEmbedding(const VocabParallelEmbeddingOptions& options, comm::ProcessGroupPtr tp)
    : options_(options), tp_(std::move(tp)) {
  const char* name = "VocabParallelEmbedding";
  divided(options.num_embeddings, nullptr, "num_embeddings", name);
  divided(options.embedding_dim, nullptr, "embedding_dim", name);
  const int r = group_rank(tp_), n = group_size(tp_);
  padded_vocab_ = pad_vocab(options.num_embeddings, n, options.pad_multiple);
  range_ = shard_range(padded_vocab_, r, n);
  weight_ = register_parameter(
      "weight", init_shard({options.num_embeddings, options.embedding_dim}, {0, options.num_embeddings}, padded_vocab_,
                           normal(options.init, "weight"), r, n, options.tensor_options));
}

at::Tensor VocabParallelEmbedding::forward(const at::Tensor& tokens) {
  return vocab_parallel_embedding(tokens, weight_, tp_, options_.reduce_scatter_output);
}

ShardSpecs VocabParallelEmbedding::shard_specs() const {
  return {{"weight", {0, options_.num_embeddings}}};
}

// --- LayerNorm -------------------------------------------------------------------------------

LayerNorm::LayerNorm(const LayerNormOptions& options) : options_(options) {
  divided(options.dim, nullptr, "dim", "LayerNorm");
  weight_ = register_parameter("weight", init_shard({options.dim}, {}, 0, kOnes, 0, 1, options.tensor_options));
  bias_ = register_parameter("bias", init_shard({options.dim}, {}, 0, kZeros, 0, 1, options.tensor_options));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) {
  TORUS_CHECK(x.defined() && at::isFloatingType(x.scalar_type()), InvalidArgument,
              "LayerNorm: the input must be a floating-point tensor");
  if (!is_reduced_float(x) && !is_reduced_float(weight_)) {
    return at::layer_norm(x, {options_.dim}, weight_, bias_, options_.eps);
  }
  // Half precision (bf16/f16 parameters or activations): the mean and the
  // variance over `dim` elements are formed in fp32, whatever the kernel
  // does internally, and the result is rounded once to the input's dtype.
  // The casts' backwards return each gradient in its tensor's dtype, the
  // weight and bias gradients summed over the tokens in fp32.
  const auto f32 = at::kFloat;
  return at::layer_norm(x.to(f32), {options_.dim}, weight_.to(f32), bias_.to(f32), options_.eps).to(x.scalar_type());
}

ShardSpecs LayerNorm::shard_specs() const {
  const ShardSpec s{.tp_partial_grad = options_.sequence_parallel};
  return {{"weight", s}, {"bias", s}};
}

// --- RMSNorm ---------------------------------------------------------------------------------

RMSNorm::RMSNorm(const RMSNormOptions& options) : options_(options) {
  divided(options.dim, nullptr, "dim", "RMSNorm");
  TORUS_CHECK(options.eps > 0, InvalidArgument, "RMSNorm: eps must be > 0, got {}", options.eps);
  weight_ = register_parameter("weight", init_shard({options.dim}, {}, 0, kOnes, 0, 1, options.tensor_options));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) {
  TORUS_CHECK(x.defined() && at::isFloatingType(x.scalar_type()) && x.dim() >= 1 && x.size(-1) == options_.dim,
              InvalidArgument, "RMSNorm: the input must be a floating-point tensor [..., {}]", options_.dim);
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor xf = x.to(acc);
  at::Tensor normed = (xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + options_.eps)).to(x.scalar_type());
  return weight_ * normed;
}

ShardSpecs RMSNorm::shard_specs() const {
  return {{"weight", ShardSpec{.tp_partial_grad = options_.sequence_parallel}}};
}

}  // namespace torus::tp

