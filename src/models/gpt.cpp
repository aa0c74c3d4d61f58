// The reference GPT (gpt.h): embedding, pre-LayerNorm blocks and head, built
// from the tensor-parallel layers.
#include "torus/models/gpt.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/log.h"
#include "models/decoder_blocks.h"
#include "torus/parallel/tensor/cross_entropy.h"
#include "torus/parallel/tensor/mappings.h"
#include "torus/parallel/tensor/weight_grad.h"
#include "torus/parallel/pipeline/partition.h"

namespace torus::models {
namespace {

using tp::RngRegion;

at::TensorOptions tensor_options(const GPTConfig& c) {
  return at::TensorOptions().dtype(c.dtype).device(c.device);
}

// Seeds are named after the parameter's place in the full model, never after
// the layout (Note [Layout-independent init]).
tp::ParamInit param_init(const GPTConfig& c, const std::string& name, double std) {
  return {tp::derive_seed(c.seed, name), std};
}
constexpr const char* kWordEmbedding = "embedding.word";

// Dropout on the hidden states: replicated over TP unless sequence parallel.
RngRegion hidden_region(const GPTConfig& c) {
  return c.sequence_parallel ? RngRegion::kSharded : RngRegion::kReplicated;
}

}  // namespace

// --- config ----------------------------------------------------------------------

void GPTConfig::validate(int tp_size) const {
  TORUS_CHECK(tp_size >= 1, InvalidArgument, "GPT: tensor-parallel size must be >= 1, got {}", tp_size);
  TORUS_CHECK(vocab_size >= 1 && max_seq_len >= 1 && num_layers >= 1 && hidden >= 1 && num_heads >= 1 && ffn() >= 1 &&
                  vocab_pad_multiple >= 1,
              InvalidArgument,
              "GPT: sizes must be >= 1 (vocab {}, max_seq_len {}, layers {}, hidden {}, heads {}, ffn {}, vocab pad "
              "multiple {})",
              vocab_size, max_seq_len, num_layers, hidden, num_heads, ffn(), vocab_pad_multiple);
  TORUS_CHECK(hidden % num_heads == 0, InvalidArgument, "GPT: hidden {} is not divisible by num_heads {}", hidden,
              num_heads);
  TORUS_CHECK(num_heads % tp_size == 0, InvalidArgument,
              "GPT: num_heads {} is not divisible by the tensor-parallel size {} (heads are split over TP)", num_heads,
              tp_size);
  TORUS_CHECK(ffn() % tp_size == 0, InvalidArgument,
              "GPT: ffn_hidden {} is not divisible by the tensor-parallel size {}", ffn(), tp_size);
  TORUS_CHECK(dropout >= 0 && dropout < 1 && attention_dropout >= 0 && attention_dropout < 1, InvalidArgument,
              "GPT: dropout {} and attention_dropout {} must be in [0, 1)", dropout, attention_dropout);
  TORUS_CHECK(at::isFloatingType(dtype), InvalidArgument, "GPT: dtype {} is not floating point", c10::toString(dtype));
  recompute.validate();
  TORUS_CHECK(moe_every >= 0, InvalidArgument, "GPT: moe_every must be >= 0 (0: no MoE blocks), got {}", moe_every);
  if (moe_every > 0) {
    TORUS_CHECK(moe_every <= num_layers, InvalidArgument,
                "GPT: moe_every {} leaves no MoE block in a model of {} layers", moe_every, num_layers);
    moe_config().validate(1);
  }
}

ep::MoEConfig GPTConfig::moe_config() const {
  ep::MoEConfig m = moe;
  m.hidden = hidden;
  if (m.ffn_hidden <= 0) m.ffn_hidden = ffn();
  m.init_std = init_std;
  m.output_init_std = init_std / std::sqrt(2.0 * static_cast<double>(num_layers));
  m.seed = seed;
  m.dtype = dtype;
  m.device = device;
  return m;
}

void GPTConfig::validate_sequence(int64_t seq_len, int tp_size) const {
  TORUS_CHECK(seq_len >= 1 && seq_len <= max_seq_len, InvalidArgument,
              "GPT: sequence length {} must be in [1, max_seq_len = {}]", seq_len, max_seq_len);
  TORUS_CHECK(!sequence_parallel || seq_len % tp_size == 0, InvalidArgument,
              "GPT: sequence parallelism needs the sequence length {} divisible by the tensor-parallel size {}",
              seq_len, tp_size);
  TORUS_CHECK(moe_every == 0 || seq_len % tp_size == 0, InvalidArgument,
              "GPT: MoE blocks split the sequence over TP: the sequence length {} must be divisible by the "
              "tensor-parallel size {}",
              seq_len, tp_size);
}

GPTConfig GPTConfig::tiny() {
  GPTConfig c;
  c.vocab_size = 61;
  c.max_seq_len = 16;
  c.num_layers = 2;
  c.hidden = 32;
  c.num_heads = 4;
  return c;
}

GPTConfig GPTConfig::small() {
  GPTConfig c;
  c.vocab_size = 8192;
  c.max_seq_len = 128;
  c.num_layers = 4;
  c.hidden = 256;
  c.num_heads = 8;
  return c;
}

GPTConfig GPTConfig::gpt2() {
  return GPTConfig{};
}

// --- embedding ---------------------------------------------------------------------

GPTEmbedding::GPTEmbedding(const GPTConfig& config, const parallel::ParallelGroups& groups,
                           std::shared_ptr<tp::RngTracker> rng)
    : config_(config), tp_(groups.tp), rng_(std::move(rng)) {
  tp::VocabParallelEmbeddingOptions o;
  o.num_embeddings = config.vocab_size;
  o.embedding_dim = config.hidden;
  o.pad_multiple = config.vocab_pad_multiple;
  o.reduce_scatter_output = config.sequence_parallel;
  o.init = param_init(config, kWordEmbedding, config.init_std);
  o.tensor_options = tensor_options(config);
  word_ = register_module("word", std::make_shared<tp::VocabParallelEmbedding>(o, tp_));
  position_ = register_parameter("position", tp::init_shard({config.max_seq_len, config.hidden}, {}, 0,
                                                            {tp::InitSpec::Kind::kNormal, config.init_std,
                                                             tp::derive_seed(config.seed, "embedding.position")},
                                                            0, 1, tensor_options(config)));
}

at::Tensor GPTEmbedding::forward(const at::Tensor& tokens) {
  TORUS_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.scalar_type() == at::kLong, InvalidArgument,
              "GPT: tokens must be an int64 tensor [batch, seq]");
  const int n = parallel::group_size(tp_);
  const int64_t seq = tokens.size(1);
  config_.validate_sequence(seq, n);
  if (tokens.device().is_cpu()) {
    // Out-of-range tokens would be silently zeroed by the vocab-parallel
    // lookup; checked on CPU only (no device synchronisation).
    TORUS_CHECK(!tokens.lt(0).logical_or_(tokens.ge(config_.vocab_size)).any().item<bool>(), InvalidArgument,
                "GPT: a token is outside the vocabulary [0, {})", config_.vocab_size);
  }
  // Sequence-first from here on; with SP the sum over TP is reduce-scattered
  // so each rank keeps seq/tp positions.
  at::Tensor x = word_->forward(tokens.t().contiguous());  // [s(/tp), b, h]
  at::Tensor pos = config_.sequence_parallel ? position_.narrow(0, parallel::group_rank(tp_) * (seq / n), seq / n)
                                             : position_.narrow(0, 0, seq);
  x = x + pos.unsqueeze(1);
  return tp::dropout(x, config_.dropout, is_training(), rng_->generator(hidden_region(config_)));
}

tp::ShardSpecs GPTEmbedding::shard_specs() const {
  // Under SP each rank adds only its slice of the position table.
  return {{"position", {.tp_partial_grad = config_.sequence_parallel}}};
}

// --- block -------------------------------------------------------------------------------

GPTBlock::GPTBlock(const GPTConfig& config, int64_t layer, const parallel::ParallelGroups& groups,
                   std::shared_ptr<tp::RngTracker> rng)
    : config_(config), tp_(groups.tp), rng_(std::move(rng)) {
  const std::string prefix = "blocks." + std::to_string(layer) + ".";
  const bool sp = config.sequence_parallel;
  const auto opts = tensor_options(config);
  const double out_std = config.init_std / std::sqrt(2.0 * static_cast<double>(config.num_layers));
  local_heads_ = config.num_heads / parallel::group_size(tp_);

  ln1_ = register_module(
      "ln1", std::make_shared<tp::LayerNorm>(tp::LayerNormOptions{config.hidden, config.layernorm_eps, sp, opts}));
  ln2_ = register_module(
      "ln2", std::make_shared<tp::LayerNorm>(tp::LayerNormOptions{config.hidden, config.layernorm_eps, sp, opts}));
  // Note [QKV layout]: rows ordered [head][q|k|v][head_dim], so a TP slice is whole heads.
  qkv_ = register_module("qkv",
                         std::make_shared<tp::ColumnParallelLinear>(
                             tp::ColumnParallelLinearOptions{config.hidden, 3 * config.hidden, false, false, sp,
                                                             param_init(config, prefix + "qkv", config.init_std), opts},
                             tp_));
  qv_bias_ = register_parameter("qv_bias", tp::init_shard({config.num_heads, 2, config.head_dim()}, {0},
                                                          config.num_heads, {tp::InitSpec::Kind::kZeros},
                                                          parallel::group_rank(tp_), parallel::group_size(tp_), opts));
  proj_ = register_module("proj", std::make_shared<tp::RowParallelLinear>(
                                      tp::RowParallelLinearOptions{config.hidden, config.hidden, true, true, sp,
                                                                   param_init(config, prefix + "proj", out_std), opts},
                                      tp_));
  if (config.is_moe_block(layer)) {
    moe_ = register_module("moe", std::make_shared<ep::MoELayer>(config.moe_config(), prefix + "moe", layer, groups,
                                                                    sp, rng_));
    return;
  }
  fc1_ = register_module("fc1",
                         std::make_shared<tp::ColumnParallelLinear>(
                             tp::ColumnParallelLinearOptions{config.hidden, config.ffn(), true, false, sp,
                                                             param_init(config, prefix + "fc1", config.init_std), opts},
                             tp_));
  fc2_ = register_module("fc2", std::make_shared<tp::RowParallelLinear>(
                                    tp::RowParallelLinearOptions{config.ffn(), config.hidden, true, true, sp,
                                                                 param_init(config, prefix + "fc2", out_std), opts},
                                    tp_));
}

at::Tensor GPTBlock::attention(const at::Tensor& x) {
  at::Tensor qkv = qkv_->forward(x);  // [s, b, 3 h / tp], all-gathered over the sequence under SP
  const int64_t s = qkv.size(0), b = qkv.size(1), hd = config_.head_dim();
  qkv = qkv.view({s, b, local_heads_, 3, hd});
  // [b, heads, s, hd] views for attention.
  at::Tensor q = (qkv.select(3, 0) + qv_bias_.select(1, 0)).permute({1, 2, 0, 3});
  at::Tensor k = qkv.select(3, 1).permute({1, 2, 0, 3});
  at::Tensor v = (qkv.select(3, 2) + qv_bias_.select(1, 1)).permute({1, 2, 0, 3});
  at::Tensor ctx;
  if (config_.recompute.recompute_attention_core()) {
    // Selective recompute: keep q, k, v; replay the s x s part in backward.
    ctx = recompute::run([this](const std::vector<at::Tensor>& in) { return attention_core(in[0], in[1], in[2]); },
                         {q, k, v}, {.rng_trackers = {rng_}});
  } else {
    ctx = attention_core(q, k, v);
  }
  ctx = ctx.permute({2, 0, 1, 3}).reshape({s, b, local_heads_ * hd});
  return proj_->forward(ctx);  // [s, b, h] (reduce-scattered to [s/tp, b, h] under SP)
}

at::Tensor GPTBlock::attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (config_.attention_dropout == 0.0 || !is_training()) {
    return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true);
  }
  // Explicit path: the probabilities are sharded by head, so their dropout
  // draws from the per-rank stream (Note [Dropout RNG rule]).
  // Note [Attention softmax in fp32]: half-precision scores are upcast
  // before the scaling and the softmax (a row of s exponentials), and the
  // probabilities rounded back for the product with V. The fused kernel
  // above does the same inside (its softmax accumulates in fp32).
  const int64_t s = q.size(2);
  const auto acc = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)).to(acc).mul_(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  at::Tensor causal = at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu_(1);
  at::Tensor probs = at::softmax(scores.masked_fill(causal, -std::numeric_limits<double>::infinity()), -1, acc);
  probs = tp::dropout(probs, config_.attention_dropout, true, rng_->generator(RngRegion::kSharded));
  return at::matmul(probs.to(v.scalar_type()), v);
}

at::Tensor GPTBlock::forward(const at::Tensor& hidden) {
  auto& gen = rng_->generator(hidden_region(config_));
  const bool train = is_training();
  at::Tensor x = hidden + tp::dropout(attention(ln1_->forward(hidden)), config_.dropout, train, gen);
  at::Tensor m = moe_ ? moe_->forward(ln2_->forward(x))
                      : fc2_->forward(at::gelu(fc1_->forward(ln2_->forward(x)), "tanh"));
  return x + tp::dropout(m, config_.dropout, train, gen);
}

tp::ShardSpecs GPTBlock::shard_specs() const {
  return {{"qv_bias", {0}}};
}

// --- head ----------------------------------------------------------------------------------

GPTHead::GPTHead(const GPTConfig& config, const parallel::ParallelGroups& groups, const at::Tensor& tied_weight)
    : config_(config), tp_(groups.tp) {
  const auto opts = tensor_options(config);
  ln_f_ = register_module("ln_f", std::make_shared<tp::LayerNorm>(tp::LayerNormOptions{
                                      config.hidden, config.layernorm_eps, config.sequence_parallel, opts}));
  if (tied_weight.defined()) {
    output_ = tied_weight;
  } else {
    // Untied; or tied but the word embedding lives on another pipeline stage:
    // a copy with the embedding's initial value.
    const int n = parallel::group_size(tp_);
    const int64_t padded = tp::pad_vocab(config.vocab_size, n, config.vocab_pad_multiple);
    const tp::ParamInit init =
        param_init(config, config.tie_embeddings ? kWordEmbedding : "head.output", config.init_std);
    output_ = register_parameter(
        "output", tp::init_shard({config.vocab_size, config.hidden}, {0, config.vocab_size}, padded,
                                 {tp::InitSpec::Kind::kNormal, init.std, tp::derive_seed(init.seed, "weight")},
                                 parallel::group_rank(tp_), n, opts));
    owns_output_ = true;
  }
}

at::Tensor GPTHead::forward(const at::Tensor& hidden) {
  // Under SP the output layer all-gathers the sequence (and reduce-scatters
  // its input gradient), like any column-parallel layer. A weight tied to
  // this model's own embedding also gets a gradient from the lookup; its
  // output-layer gradient is never deferred (Note [Deferred weight
  // gradients]), so that both arrive in the same backward pass.
  tp::DeferWeightGradGuard defer(tp::weight_grad_deferral_enabled() && owns_output_);
  return tp::column_parallel_linear(ln_f_->forward(hidden), output_, at::Tensor(), tp_,
                                    {.gather_output = false, .sequence_parallel = config_.sequence_parallel});
}

at::Tensor GPTHead::loss(const at::Tensor& logits, const at::Tensor& labels) const {
  return mean_token_loss(logits, labels, tp_, config_.vocab_size);
}

at::Tensor mean_token_loss(const at::Tensor& logits, const at::Tensor& labels, const comm::ProcessGroupPtr& tp,
                           int64_t vocab_size) {
  TORUS_CHECK(labels.defined() && labels.dim() == 2 && labels.scalar_type() == at::kLong, InvalidArgument,
              "decoder: labels must be an int64 tensor [batch, seq]");
  at::Tensor targets = labels.t();  // sequence-first, like the logits
  // fp32 per-token losses whatever the logits' dtype (Note [Cross entropy in
  // fp32]); their sum and the token count (exact below 2^24) are fp32 too.
  at::Tensor per_token = tp::vocab_parallel_cross_entropy(logits, targets, tp, {.vocab_size = vocab_size});
  at::Tensor count = targets.ne(-100).sum().clamp_min(1).to(per_token.scalar_type());
  return per_token.sum() / count;
}

tp::ShardSpecs GPTHead::shard_specs() const {
  if (!owns_output_) return {};
  return {{"output", {0, config_.vocab_size}}};
}

// --- GPT ---------------------------------------------------------------------------------------

GPT::GPT(const GPTConfig& config, const parallel::ParallelGroups& groups, const GPTPart& part)
    : config_(config), groups_(groups), part_(part) {
  const int n = groups.tp_size();
  config.validate(n);
  const int64_t last = part.num_layers < 0 ? config.num_layers : part.first_layer + part.num_layers;
  TORUS_CHECK(part.first_layer >= 0 && last <= config.num_layers && part.first_layer <= last, InvalidArgument,
              "GPT: part layers [{}, {}) outside the model's {} layers", part.first_layer, last, config.num_layers);
  padded_vocab_ = tp::pad_vocab(config.vocab_size, n, config.vocab_pad_multiple);
  rng_ = std::make_shared<tp::RngTracker>(config.seed, groups.tp_rank(), config.device, part.stage);
  if (part.embedding) embedding_ = register_module("embedding", std::make_shared<GPTEmbedding>(config, groups, rng_));
  if (last > part.first_layer) {
    auto blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
    for (int64_t i = part.first_layer; i < last; ++i) {
      blocks_.push_back(
          blocks->register_module(std::to_string(i), std::make_shared<GPTBlock>(config, i, groups, rng_)));
    }
  }
  if (part.head) {
    at::Tensor tied = config.tie_embeddings && embedding_ ? embedding_->word()->weight() : at::Tensor();
    head_ = register_module("head", std::make_shared<GPTHead>(config, groups, tied));
  }
}

at::Tensor GPT::forward(const at::Tensor& input) {
  at::Tensor x = embedding_ ? embedding_->forward(input) : input;
  x = run_blocks(blocks_, part_.first_layer, config_.recompute, rng_, block_hooks_, x);
  return head_ ? head_->forward(x) : x;
}

at::Tensor GPT::loss(const at::Tensor& input, const at::Tensor& labels) {
  TORUS_CHECK(head_ != nullptr, InvalidArgument, "GPT::loss: this pipeline part has no head");
  TORUS_CHECK(labels.defined() && labels.dim() == 2, InvalidArgument, "GPT: labels must be [batch, seq]");
  if (embedding_) {
    TORUS_CHECK(input.dim() == 2 && input.sizes() == labels.sizes(), InvalidArgument,
                "GPT::loss: tokens [{}] and labels [{}] differ in shape", fmt::join(input.sizes(), ", "),
                fmt::join(labels.sizes(), ", "));
  }
  return head_->loss(forward(input), labels);
}

at::Tensor GPT::loss_of(const at::Tensor& logits, const at::Tensor& labels) const {
  TORUS_CHECK(head_ != nullptr, InvalidArgument, "GPT: loss on a pipeline part without the head");
  return head_->loss(logits, labels);
}

// --- pipeline cuts -----------------------------------------------------------------

std::vector<double> gpt_item_costs(const GPTConfig& config, int64_t seq_len) {
  const double h = static_cast<double>(config.hidden), s = static_cast<double>(seq_len);
  const double v = static_cast<double>(config.vocab_size);
  std::vector<double> costs;
  costs.reserve(config.num_layers + 2);
  costs.push_back(h);
  const ep::MoEConfig moe = config.moe_config();
  for (int64_t l = 0; l < config.num_layers; ++l) {
    // An MoE block's MLP: k experts per token, and the router.
    const double mlp = config.is_moe_block(l)
                           ? static_cast<double>(moe.top_k) * 2.0 * h * static_cast<double>(moe.ffn_hidden) +
                                 h * static_cast<double>(moe.num_experts)
                           : 2.0 * h * config.ffn();
    costs.push_back(2.0 * (3 * h * h + h * h + mlp) + 4.0 * s * h);
  }
  costs.push_back(2.0 * h * v + 5.0 * v);
  return costs;
}

std::vector<GPTPart> gpt_stage_parts(const GPTConfig& config, int num_stages, int64_t seq_len,
                                     const std::vector<int64_t>& layers_per_stage) {
  return decoder_stage_parts(gpt_item_costs(config, seq_len), num_stages, layers_per_stage, "GPT");
}

std::vector<DecoderPart> decoder_stage_parts(const std::vector<double>& item_costs, int num_stages,
                                             const std::vector<int64_t>& layers_per_stage, const char* what) {
  TORUS_CHECK(num_stages >= 1, InvalidArgument, "{} pipeline: num_stages must be >= 1, got {}", what, num_stages);
  TORUS_CHECK(item_costs.size() >= 2, InvalidArgument, "{} pipeline: {} item costs (embedding, blocks, head)", what,
              item_costs.size());
  const int64_t L = static_cast<int64_t>(item_costs.size()) - 2;
  std::vector<DecoderPart> parts(num_stages);
  if (!layers_per_stage.empty()) {
    TORUS_CHECK(static_cast<int>(layers_per_stage.size()) == num_stages, InvalidArgument,
                "{} pipeline: {} layer counts given for {} stages", what, layers_per_stage.size(), num_stages);
    int64_t first = 0;
    for (int s = 0; s < num_stages; ++s) {
      const int64_t n = layers_per_stage[s];
      TORUS_CHECK(n >= 0, InvalidArgument, "{} pipeline: stage {} has {} layers", what, s, n);
      TORUS_CHECK(n > 0 || s == 0 || s == num_stages - 1, InvalidArgument,
                  "{} pipeline: stage {} of {} would be empty (0 layers; only the first and last stages hold "
                  "the embedding or the head)",
                  what, s, num_stages);
      parts[s] = DecoderPart{s == 0, first, n, s == num_stages - 1, s};
      first += n;
    }
    TORUS_CHECK(first == L, InvalidArgument, "{} pipeline: the layer counts per stage sum to {}, the model has {}",
                what, first, L);
    return parts;
  }
  TORUS_CHECK(L + 2 >= num_stages, InvalidArgument,
              "{} pipeline: {} layers plus embedding and head cannot fill {} stages", what, L, num_stages);
  if (num_stages == 1) return {DecoderPart{true, 0, L, true}};
  const pp::Partition cut = pp::partition_balanced(item_costs, num_stages);
  for (int s = 0; s < num_stages; ++s) {
    // Items [b, e): item 0 is the embedding, item L+1 the head, item i the block i-1.
    const int64_t b = cut.begin(s), e = cut.end(s);
    DecoderPart part;
    part.embedding = b == 0;
    part.head = e == L + 2;
    part.first_layer = std::max<int64_t>(b, 1) - 1;
    part.num_layers = std::min<int64_t>(e, L + 1) - 1 - part.first_layer;
    part.stage = s;
    parts[s] = part;
  }
  return parts;
}

std::string describe_part(const GPTPart& part, int64_t num_layers) {
  std::string out;
  if (part.embedding) out = "embedding";
  const int64_t n = part.num_layers < 0 ? num_layers - part.first_layer : part.num_layers;
  if (n > 0) {
    if (!out.empty()) out += " + ";
    out += n == 1 ? "block " + std::to_string(part.first_layer)
                  : "blocks " + std::to_string(part.first_layer) + "-" + std::to_string(part.first_layer + n - 1);
  }
  if (part.head) out += out.empty() ? "head" : " + head";
  return out.empty() ? "(empty)" : out;
}

}  // namespace torus::models
