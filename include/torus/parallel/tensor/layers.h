// torus/parallel/tensor/layers.h — tensor-parallel layers (Megatron-style),
// as functions (the autograd work; also what the Python layers call) and as
// torch::nn::Modules that own layout-independent parameters.
//
//  * ColumnParallelLinear: Y = X W^T + b with W [out, in] split by rows: rank
//    r holds W[r*out/tp : (r+1)*out/tp, :] and produces that slice of Y's last
//    dimension (optionally all-gathered back).
//  * RowParallelLinear: W split by columns: rank r holds W[:, r*in/tp : ...]
//    and takes the matching slice of X's last dimension; the partial products
//    are summed over TP (all-reduce, or reduce-scatter along the sequence
//    under sequence parallelism). The bias is replicated and added once.
//  * VocabParallelEmbedding: the table [vocab, h] split by rows (vocabulary
//    padded to a multiple of tp; padded rows are zero and never looked up).
//  * LayerNorm: replicated; inside a sequence-parallel region its gradients
//    are partial over TP (ShardSpec::tp_partial_grad). With bf16/f16 inputs
//    or parameters it computes in fp32 and returns the input's dtype.
//
// Half precision (docs/precision.md): outputs keep the input's dtype and
// every gradient its tensor's dtype; the embedding's table gradient is
// summed in fp32 (Note [Embedding gradient in fp32], layers.cpp).
//
// Sequence parallelism (`sequence_parallel`): activations entering a column-
// parallel layer and leaving a row-parallel one are sharded along dimension 0
// (sequence-first layout, Note [TP layouts] in mappings.h); the layers
// all-gather / reduce-scatter at those boundaries instead of the identity /
// all-reduce.
//
// Constructors validate sizes against the TP group size and throw
// InvalidArgument before any communication. Forward and backward communicate
// over the TP group (see mappings.h for ordering rules). Not thread safe.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>

#include "torus/comm/process_group.h"
#include "torus/parallel/tensor/sharding.h"

namespace torus::tp {

// --- functional forms -----------------------------------------------------------

struct ColumnParallelOptions {
  bool gather_output = false;      // all-gather the output's last dimension
  bool sequence_parallel = false;  // x is [s/tp, ...]: all-gather it along dim 0 first
};
// x [..., in] (replicated, or [s/tp, ..., in] under sequence parallelism);
// weight [out/tp, in]; bias [out/tp] or undefined. Returns [..., out/tp]
// ([..., out] when gathered).
at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  const comm::ProcessGroupPtr& tp, const ColumnParallelOptions& options = {});

struct RowParallelOptions {
  bool input_is_parallel = true;   // false: x is replicated [..., in] and is split here
  bool sequence_parallel = false;  // reduce-scatter the output along dim 0 instead of all-reduce
};
// x [..., in/tp]; weight [out, in/tp]; bias [out] (replicated) or undefined.
// Returns [..., out] ([s/tp, ..., out] under sequence parallelism).
at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               const comm::ProcessGroupPtr& tp, const RowParallelOptions& options = {});

// tokens (int64, any shape; values in [0, vocab)); weight [padded_vocab/tp, h],
// this rank's rows starting at tp_rank * weight.size(0). Returns tokens.shape
// + [h], summed over TP; with `reduce_scatter_output` the sum is
// reduce-scattered along dim 0 instead (tokens sequence-first [s, b] -> [s/tp, b, h]).
at::Tensor vocab_parallel_embedding(const at::Tensor& tokens, const at::Tensor& weight, const comm::ProcessGroupPtr& tp,
                                    bool reduce_scatter_output = false);

// --- modules --------------------------------------------------------------------

// Parameter initialisation shared by the layers (Note [Layout-independent init]).
struct ParamInit {
  uint64_t seed = 0;  // the layer's seed; each parameter derives its own from it
  double std = 0.02;  // weights ~ N(0, std); biases start at zero
};

struct ColumnParallelLinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;  // global; divisible by the TP size
  bool bias = true;
  bool gather_output = false;
  bool sequence_parallel = false;
  ParamInit init;
  at::TensorOptions tensor_options = at::TensorOptions().dtype(at::kFloat);
};

class ColumnParallelLinear : public torch::nn::Module, public ShardedModule {
 public:
  ColumnParallelLinear(const ColumnParallelLinearOptions& options, comm::ProcessGroupPtr tp);
  at::Tensor forward(const at::Tensor& x);
  ShardSpecs shard_specs() const override;
  const at::Tensor& weight() const { return weight_; }  // [out/tp, in]
  const at::Tensor& bias() const { return bias_; }      // [out/tp] or undefined
  const ColumnParallelLinearOptions& options() const { return options_; }

 private:
  ColumnParallelLinearOptions options_;
  comm::ProcessGroupPtr tp_;
  at::Tensor weight_;
  at::Tensor bias_;
};

struct RowParallelLinearOptions {
  int64_t in_features = 0;  // global; divisible by the TP size
  int64_t out_features = 0;
  bool bias = true;
  bool input_is_parallel = true;
  bool sequence_parallel = false;
  ParamInit init;
  at::TensorOptions tensor_options = at::TensorOptions().dtype(at::kFloat);
};

class RowParallelLinear : public torch::nn::Module, public ShardedModule {
 public:
  RowParallelLinear(const RowParallelLinearOptions& options, comm::ProcessGroupPtr tp);
  at::Tensor forward(const at::Tensor& x);
  ShardSpecs shard_specs() const override;
  const at::Tensor& weight() const { return weight_; }  // [out, in/tp]
  const at::Tensor& bias() const { return bias_; }      // [out] or undefined
  const RowParallelLinearOptions& options() const { return options_; }

 private:
  RowParallelLinearOptions options_;
  comm::ProcessGroupPtr tp_;
  at::Tensor weight_;
  at::Tensor bias_;
};

struct VocabParallelEmbeddingOptions {
  int64_t num_embeddings = 0;  // vocabulary size (unpadded)
  int64_t embedding_dim = 0;
  int64_t pad_multiple = 1;            // pad the vocabulary to a multiple of pad_multiple * tp
  bool reduce_scatter_output = false;  // sequence parallelism (tokens sequence-first)
  ParamInit init;
  at::TensorOptions tensor_options = at::TensorOptions().dtype(at::kFloat);
};

class VocabParallelEmbedding : public torch::nn::Module, public ShardedModule {
 public:
  VocabParallelEmbedding(const VocabParallelEmbeddingOptions& options, comm::ProcessGroupPtr tp);
  at::Tensor forward(const at::Tensor& tokens);
  ShardSpecs shard_specs() const override;
  const at::Tensor& weight() const { return weight_; }  // [padded_vocab/tp, h]
  int64_t padded_vocab() const { return padded_vocab_; }
  ShardRange vocab_range() const { return range_; }  // this rank's rows of the padded vocabulary
  const VocabParallelEmbeddingOptions& options() const { return options_; }

 private:
  VocabParallelEmbeddingOptions options_;
  comm::ProcessGroupPtr tp_;
  int64_t padded_vocab_ = 0;
  ShardRange range_;
  at::Tensor weight_;
};

struct LayerNormOptions {
  int64_t dim = 0;
  double eps = 1e-5;
  bool sequence_parallel = false;  // lives in a sequence-parallel region: gradients partial over TP
  at::TensorOptions tensor_options = at::TensorOptions().dtype(at::kFloat);
};

class LayerNorm : public torch::nn::Module, public ShardedModule {
 public:
  explicit LayerNorm(const LayerNormOptions& options);
  at::Tensor forward(const at::Tensor& x);
  ShardSpecs shard_specs() const override;
  const at::Tensor& weight() const { return weight_; }
  const at::Tensor& bias() const { return bias_; }

 private:
  LayerNormOptions options_;
  at::Tensor weight_;
  at::Tensor bias_;
};

// Root-mean-square normalisation (Zhang & Sennrich 2019; Llama): x /
// sqrt(mean(x^2 over `dim`) + eps) times a gain, no bias and no centring.
// The mean of squares is formed in fp32 for half-precision inputs and the
// normalised value rounded to the input's dtype before the gain is applied
// (the order Hugging Face's Llama uses). Under sequence parallelism its
// gradient is partial over TP, as LayerNorm's.
struct RMSNormOptions {
  int64_t dim = 0;
  double eps = 1e-5;
  bool sequence_parallel = false;
  at::TensorOptions tensor_options = at::TensorOptions().dtype(at::kFloat);
};

class RMSNorm : public torch::nn::Module, public ShardedModule {
 public:
  explicit RMSNorm(const RMSNormOptions& options);
  at::Tensor forward(const at::Tensor& x);
  ShardSpecs shard_specs() const override;
  const at::Tensor& weight() const { return weight_; }

 private:
  RMSNormOptions options_;
  at::Tensor weight_;
};

}  // namespace torus::tp
