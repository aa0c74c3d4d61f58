// The Llama-family decoder (llama.h): RMSNorm, rotary embeddings, grouped-
// query attention and SwiGLU, built from the tensor-parallel layers.
#include "torus/models/llama.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>
#include <numbers>

#include "core/log.h"
#include "models/decoder_blocks.h"
#include "torus/parallel/tensor/weight_grad.h"

namespace torus::models {
namespace {

at::TensorOptions tensor_options(const LlamaConfig& c) { return at::TensorOptions().dtype(c.dtype).device(c.device); }

// Seeds are named after the parameter's place in the full model (Note
// [Layout-independent init]); a layer's weight derives its own from them as
// the TP layers do.
tp::ParamInit param_init(const LlamaConfig& c, const std::string& name, double std) {
  return {tp::derive_seed(c.seed, name), std};
}
tp::InitSpec weight_init(const LlamaConfig& c, const std::string& name, double std) {
  return {tp::InitSpec::Kind::kNormal, std, tp::derive_seed(tp::derive_seed(c.seed, name), "weight")};
}
constexpr const char* kWordEmbedding = "embedding.word";

double output_std(const LlamaConfig& c) { return c.init_std / std::sqrt(2.0 * static_cast<double>(c.num_layers)); }

}  // namespace

// --- config ------------------------------------------------------------------------

int64_t LlamaConfig::ffn() const {
  if (ffn_hidden > 0) return ffn_hidden;
  const int64_t f = (8 * hidden + 2) / 3;
  return (f + 255) / 256 * 256;
}

void LlamaConfig::validate(int tp_size) const {
  TORUS_CHECK(tp_size >= 1, InvalidArgument, "Llama: tensor-parallel size must be >= 1, got {}", tp_size);
  TORUS_CHECK(vocab_size >= 1 && max_seq_len >= 1 && num_layers >= 1 && hidden >= 1 && num_heads >= 1 &&
                  num_kv_heads >= 0 && head_dim >= 0 && ffn_hidden >= 0 && vocab_pad_multiple >= 1,
              InvalidArgument,
              "Llama: sizes must be >= 1 (vocab {}, max_seq_len {}, layers {}, hidden {}, heads {}, kv heads {}, "
              "head_dim {}, ffn {}, vocab pad multiple {})",
              vocab_size, max_seq_len, num_layers, hidden, num_heads, num_kv_heads, head_dim, ffn_hidden,
              vocab_pad_multiple);
  TORUS_CHECK(head_dim > 0 || hidden % num_heads == 0, InvalidArgument,
              "Llama: hidden {} is not divisible by num_heads {} (or give head_dim)", hidden, num_heads);
  TORUS_CHECK(dim_per_head() % 2 == 0, InvalidArgument,
              "Llama: the head dimension {} must be even (rotary embeddings rotate pairs)", dim_per_head());
  TORUS_CHECK(num_heads % kv_heads() == 0, InvalidArgument,
              "Llama: num_heads {} is not a multiple of num_kv_heads {} (grouped-query attention)", num_heads,
              kv_heads());
  TORUS_CHECK(num_heads % tp_size == 0, InvalidArgument,
              "Llama: num_heads {} is not divisible by the tensor-parallel size {} (query heads are split over TP)",
              num_heads, tp_size);
  TORUS_CHECK(ffn() % tp_size == 0, InvalidArgument,
              "Llama: ffn_hidden {} is not divisible by the tensor-parallel size {}", ffn(), tp_size);
  TORUS_CHECK(rms_eps > 0 && rope_theta > 0, InvalidArgument, "Llama: rms_eps {} and rope_theta {} must be > 0",
              rms_eps, rope_theta);
  const RopeScaling& r = rope_scaling;
  TORUS_CHECK(r.type == "none" || r.type == "linear" || r.type == "llama3", InvalidArgument,
              "Llama: rope scaling '{}' is not one of none, linear, llama3", r.type);
  TORUS_CHECK(r.type == "none" || r.factor > 0, InvalidArgument, "Llama: rope scaling factor {} must be > 0",
              r.factor);
  TORUS_CHECK(r.type != "llama3" || (r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor &&
                                     r.original_max_position >= 1),
              InvalidArgument,
              "Llama: llama3 rope scaling needs 0 < low_freq_factor ({}) < high_freq_factor ({}) and "
              "original_max_position ({}) >= 1",
              r.low_freq_factor, r.high_freq_factor, r.original_max_position);
  TORUS_CHECK(at::isFloatingType(dtype), InvalidArgument, "Llama: dtype {} is not floating point",
              c10::toString(dtype));
  recompute.validate();
}

void LlamaConfig::validate_sequence(int64_t seq_len, int tp_size) const {
  TORUS_CHECK(seq_len >= 1 && seq_len <= max_seq_len, InvalidArgument,
              "Llama: sequence length {} must be in [1, max_seq_len = {}]", seq_len, max_seq_len);
  TORUS_CHECK(!sequence_parallel || seq_len % tp_size == 0, InvalidArgument,
              "Llama: sequence parallelism needs the sequence length {} divisible by the tensor-parallel size {}",
              seq_len, tp_size);
}

LlamaConfig LlamaConfig::tiny() {
  LlamaConfig c;
  c.vocab_size = 61;
  c.max_seq_len = 16;
  c.num_layers = 2;
  c.hidden = 32;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden = 64;
  return c;
}

// --- rotary embeddings ------------------------------------------------------------------

std::pair<at::Tensor, at::Tensor> rotary_tables(const LlamaConfig& c, int64_t seq_len, c10::Device device) {
  const int64_t d = c.dim_per_head();
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // 1 / theta^(2i/d) in f32, as Hugging Face computes it.
  at::Tensor exponent = at::arange(0, d, 2, f32.dtype(at::kLong)).to(at::kFloat) / static_cast<double>(d);
  at::Tensor inv_freq = at::pow(c.rope_theta, exponent).reciprocal();
  const RopeScaling& r = c.rope_scaling;
  if (r.type == "linear") {
    inv_freq = inv_freq / r.factor;
  } else if (r.type == "llama3") {
    // Wavelengths longer than the pre-training context / low_freq_factor are
    // stretched by `factor`; shorter than context / high_freq_factor kept;
    // in between, blended linearly in context / wavelength.
    const double ctx = static_cast<double>(r.original_max_position);
    const double low_wavelen = ctx / r.low_freq_factor, high_wavelen = ctx / r.high_freq_factor;
    at::Tensor wavelen = (2 * std::numbers::pi) / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
    at::Tensor smooth = (ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
    at::Tensor medium = wavelen.ge(high_wavelen).logical_and(wavelen.le(low_wavelen));
    inv_freq = at::where(medium, smoothed, scaled);
  }
  at::Tensor pos = at::arange(seq_len, f32.dtype(at::kLong)).to(at::kFloat);
  at::Tensor angles = at::outer(pos, inv_freq);  // [s, d/2]
  at::Tensor emb = at::cat({angles, angles}, -1).to(device);
  return {emb.cos(), emb.sin()};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor c = cos.to(x.scalar_type()), s = sin.to(x.scalar_type());
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * c + rotated * s;
}

// --- pipeline cuts --------------------------------------------------------------------

std::vector<double> llama_item_costs(const LlamaConfig& c, int64_t seq_len) {
  const double h = static_cast<double>(c.hidden), s = static_cast<double>(seq_len);
  const double q = static_cast<double>(c.num_heads * c.dim_per_head());
  const double kv = static_cast<double>(c.kv_heads() * c.dim_per_head());
  const double f = static_cast<double>(c.ffn()), v = static_cast<double>(c.vocab_size);
  std::vector<double> costs;
  costs.push_back(h);
  for (int64_t l = 0; l < c.num_layers; ++l) costs.push_back(2.0 * (h * q + 2 * h * kv + q * h + 3 * h * f) + 4.0 * s * q);
  costs.push_back(2.0 * h * v + 5.0 * v);
  return costs;
}

std::vector<DecoderPart> llama_stage_parts(const LlamaConfig& config, int num_stages, int64_t seq_len,
                                           const std::vector<int64_t>& layers_per_stage) {
  return decoder_stage_parts(llama_item_costs(config, seq_len), num_stages, layers_per_stage, "Llama");
}

// --- key/value projections -------------------------------------------------------------

LlamaKV::LlamaKV(int64_t out_features, int64_t in_features, bool split, const tp::InitSpec& init,
                 const parallel::ParallelGroups& groups, const at::TensorOptions& options) {
  const int n = groups.tp_size();
  spec_ = split ? tp::ShardSpec{.dim = 0} : tp::ShardSpec{.tp_partial_grad = n > 1};
  weight_ = register_parameter("weight", tp::init_shard({out_features, in_features}, spec_, out_features, init,
                                                        groups.tp_rank(), n, options));
}

// --- block -------------------------------------------------------------------------------

LlamaBlock::LlamaBlock(const LlamaConfig& config, int64_t layer, const parallel::ParallelGroups& groups)
    : config_(config), tp_(groups.tp) {
  const std::string prefix = "blocks." + std::to_string(layer) + ".";
  const bool sp = config.sequence_parallel;
  const auto opts = tensor_options(config);
  const int n = groups.tp_size();
  const int64_t h = config.hidden, d = config.dim_per_head(), H = config.num_heads, K = config.kv_heads();
  local_heads_ = H / n;
  kv_split_ = config.kv_split(n);
  local_kv_heads_ = kv_split_ ? K / n : K;
  if (!kv_split_) {
    // Each local query head reads kv head (global query head) / (H / K).
    std::vector<int64_t> index(local_heads_);
    for (int64_t j = 0; j < local_heads_; ++j) index[j] = (groups.tp_rank() * local_heads_ + j) / (H / K);
    kv_index_ = at::tensor(index, at::TensorOptions().dtype(at::kLong)).to(config.device);
  }
  const tp::RMSNormOptions norm{h, config.rms_eps, sp, opts};
  attn_norm_ = register_module("attn_norm", std::make_shared<tp::RMSNorm>(norm));
  q_ = register_module("q", std::make_shared<tp::ColumnParallelLinear>(
                                tp::ColumnParallelLinearOptions{h, H * d, false, false, sp,
                                                                param_init(config, prefix + "q", config.init_std), opts},
                                tp_));
  k_ = register_module("k", std::make_shared<LlamaKV>(K * d, h, kv_split_,
                                                      weight_init(config, prefix + "k", config.init_std), groups, opts));
  v_ = register_module("v", std::make_shared<LlamaKV>(K * d, h, kv_split_,
                                                      weight_init(config, prefix + "v", config.init_std), groups, opts));
  o_ = register_module("o", std::make_shared<tp::RowParallelLinear>(
                                tp::RowParallelLinearOptions{H * d, h, false, true, sp,
                                                             param_init(config, prefix + "o", output_std(config)), opts},
                                tp_));
  mlp_norm_ = register_module("mlp_norm", std::make_shared<tp::RMSNorm>(norm));
  const int64_t f = config.ffn();
  gate_ = register_module("gate", std::make_shared<tp::ColumnParallelLinear>(
                                      tp::ColumnParallelLinearOptions{
                                          h, f, false, false, sp, param_init(config, prefix + "gate", config.init_std), opts},
                                      tp_));
  up_ = register_module("up", std::make_shared<tp::ColumnParallelLinear>(
                                  tp::ColumnParallelLinearOptions{h, f, false, false, sp,
                                                                  param_init(config, prefix + "up", config.init_std), opts},
                                  tp_));
  down_ = register_module("down", std::make_shared<tp::RowParallelLinear>(
                                      tp::RowParallelLinearOptions{
                                          f, h, false, true, sp, param_init(config, prefix + "down", output_std(config)), opts},
                                      tp_));
}

at::Tensor LlamaBlock::attention(const at::Tensor& x) {
  const bool sp = config_.sequence_parallel;
  const int64_t d = config_.dim_per_head();
  at::Tensor q = q_->forward(x);  // [s, b, H d / tp] (the sequence all-gathered under SP)
  const tp::ColumnParallelOptions kv_opts{.gather_output = false, .sequence_parallel = sp};
  at::Tensor k = tp::column_parallel_linear(x, k_->weight(), at::Tensor(), tp_, kv_opts);
  at::Tensor v = tp::column_parallel_linear(x, v_->weight(), at::Tensor(), tp_, kv_opts);
  const int64_t s = q.size(0), b = q.size(1);
  // [b, heads, s, d] for attention.
  q = q.view({s, b, local_heads_, d}).permute({1, 2, 0, 3});
  k = k.view({s, b, local_kv_heads_, d}).permute({1, 2, 0, 3});
  v = v.view({s, b, local_kv_heads_, d}).permute({1, 2, 0, 3});
  const auto [cos, sin] = rotary_tables(config_, s, q.device());
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  if (kv_split_) {
    const int64_t group = local_heads_ / local_kv_heads_;
    if (group > 1) {
      k = k.repeat_interleave(group, 1);
      v = v.repeat_interleave(group, 1);
    }
  } else {
    k = k.index_select(1, kv_index_);
    v = v.index_select(1, kv_index_);
  }
  auto core = [](const std::vector<at::Tensor>& in) {
    return at::scaled_dot_product_attention(in[0], in[1], in[2], std::nullopt, 0.0, /*is_causal=*/true);
  };
  // Selective recompute: keep q, k, v; replay the s x s part in backward.
  at::Tensor ctx = config_.recompute.recompute_attention_core() ? recompute::run(core, {q, k, v}, {})
                                                                : core({q, k, v});
  ctx = ctx.permute({2, 0, 1, 3}).reshape({s, b, local_heads_ * d});
  return o_->forward(ctx);  // [s, b, h] (reduce-scattered to [s/tp, b, h] under SP)
}

at::Tensor LlamaBlock::forward(const at::Tensor& hidden) {
  at::Tensor x = hidden + attention(attn_norm_->forward(hidden));
  at::Tensor m = mlp_norm_->forward(x);
  return x + down_->forward(at::silu(gate_->forward(m)) * up_->forward(m));
}

// --- the model -------------------------------------------------------------------------------

Llama::Llama(const LlamaConfig& config, const parallel::ParallelGroups& groups, const DecoderPart& part)
    : config_(config), groups_(groups), part_(part) {
  const int n = groups.tp_size();
  config.validate(n);
  const int64_t last = part.num_layers < 0 ? config.num_layers : part.first_layer + part.num_layers;
  TORUS_CHECK(part.first_layer >= 0 && last <= config.num_layers && part.first_layer <= last, InvalidArgument,
              "Llama: part layers [{}, {}) outside the model's {} layers", part.first_layer, last, config.num_layers);
  part_.num_layers = last - part.first_layer;
  padded_vocab_ = tp::pad_vocab(config.vocab_size, n, config.vocab_pad_multiple);
  rng_ = std::make_shared<tp::RngTracker>(config.seed, groups.tp_rank(), config.device, part.stage);
  const auto opts = tensor_options(config);
  if (part.embedding) {
    tp::VocabParallelEmbeddingOptions o;
    o.num_embeddings = config.vocab_size;
    o.embedding_dim = config.hidden;
    o.pad_multiple = config.vocab_pad_multiple;
    o.reduce_scatter_output = config.sequence_parallel;
    o.init = param_init(config, kWordEmbedding, config.init_std);
    o.tensor_options = opts;
    auto embedding = register_module("embedding", std::make_shared<torch::nn::Module>());
    word_ = embedding->register_module("word", std::make_shared<tp::VocabParallelEmbedding>(o, groups.tp));
  }
  if (last > part.first_layer) {
    auto blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
    for (int64_t i = part.first_layer; i < last; ++i) {
      blocks_.push_back(blocks->register_module(std::to_string(i), std::make_shared<LlamaBlock>(config, i, groups)));
    }
  }
  if (part.head) {
    auto head = register_module("head", std::make_shared<torch::nn::Module>());
    head_norm_ = head->register_module(
        "norm", std::make_shared<tp::RMSNorm>(
                    tp::RMSNormOptions{config.hidden, config.rms_eps, config.sequence_parallel, opts}));
    if (config.tie_embeddings && word_) {
      output_ = word_->weight();
    } else {
      // Untied; or tied with the embedding on another stage: a copy with its
      // initial value (the engine adds the two copies' gradients).
      const tp::ParamInit init =
          param_init(config, config.tie_embeddings ? kWordEmbedding : "head.output", config.init_std);
      output_ = head->register_parameter(
          "output", tp::init_shard({config.vocab_size, config.hidden}, {0, config.vocab_size}, padded_vocab_,
                                   {tp::InitSpec::Kind::kNormal, init.std, tp::derive_seed(init.seed, "weight")},
                                   groups.tp_rank(), n, opts));
      owns_output_ = true;
    }
  }
}

tp::ShardSpecs Llama::shard_specs() const {
  if (!owns_output_) return {};
  return {{"head.output", {0, config_.vocab_size}}};
}

at::Tensor Llama::forward(const at::Tensor& input) {
  at::Tensor x = input;
  if (word_) {
    TORUS_CHECK(input.defined() && input.dim() == 2 && input.scalar_type() == at::kLong, InvalidArgument,
                "Llama: tokens must be an int64 tensor [batch, seq]");
    config_.validate_sequence(input.size(1), groups_.tp_size());
    if (input.device().is_cpu()) {
      // Out-of-range tokens would be silently zeroed by the vocab-parallel
      // lookup; checked on CPU only (no device synchronisation).
      TORUS_CHECK(!input.lt(0).logical_or_(input.ge(config_.vocab_size)).any().item<bool>(), InvalidArgument,
                  "Llama: a token is outside the vocabulary [0, {})", config_.vocab_size);
    }
    x = word_->forward(input.t().contiguous());  // [s(/tp), b, h], sequence-first
  }
  x = run_blocks(blocks_, part_.first_layer, config_.recompute, rng_, block_hooks_, x);
  if (!head_norm_) return x;
  // As GPTHead: a weight tied to this part's own embedding is never deferred
  // (Note [Deferred weight gradients]).
  tp::DeferWeightGradGuard defer(tp::weight_grad_deferral_enabled() && owns_output_);
  return tp::column_parallel_linear(head_norm_->forward(x), output_, at::Tensor(), groups_.tp,
                                    {.gather_output = false, .sequence_parallel = config_.sequence_parallel});
}

at::Tensor Llama::loss_of(const at::Tensor& logits, const at::Tensor& labels) const {
  TORUS_CHECK(head_norm_ != nullptr, InvalidArgument, "Llama: loss on a pipeline part without the head");
  return mean_token_loss(logits, labels, groups_.tp, config_.vocab_size);
}

}  // namespace torus::models
