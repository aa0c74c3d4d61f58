// Mixture-of-experts layer and expert parallelism (moe.h): router, drop
// policy, dispatch/combine over ep, auxiliary losses.
#include "torus/parallel/expert/moe.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/log.h"
#include "parallel/tensor/group_capsule.h"
#include "torus/parallel/replay.h"
#include "torus/parallel/tensor/mappings.h"

namespace torus::ep {
namespace {

using parallel::group_rank;
using parallel::group_size;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<int64_t> exchange_ns{0};

int64_t sum_of(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// x's rows exchanged over g: blocks of send[q] rows to rank q, recv[q] rows from it.
at::Tensor exchange(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                    const comm::ProcessGroupPtr& g) {
  TORUS_CHECK(x.size(0) == sum_of(send), InvalidArgument, "moe all_to_all: {} rows but the send splits sum to {}",
              x.size(0), sum_of(send));
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = sum_of(recv);
  at::Tensor out = at::empty(shape, x.options());
  at::Tensor in = tp::detail::comm_alias(x.contiguous());
  at::Tensor dst = tp::detail::comm_alias(out);
  const auto t0 = std::chrono::steady_clock::now();
  g->all_to_all(in, dst, comm::AllToAllOptions{send, recv})->wait();
  exchange_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

struct AllToAllFn : torch::autograd::Function<AllToAllFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> send,
                            std::vector<int64_t> recv, const comm::ProcessGroupPtr& g) {
    ctx->saved_data["g"] = tp::detail::pack_group(g);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange(x, send, recv, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto send = ctx->saved_data["send"].toIntVector();
    const auto recv = ctx->saved_data["recv"].toIntVector();
    return {exchange(grads[0], recv, send, tp::detail::unpack_group(ctx->saved_data["g"])), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

struct InjectLossFn : torch::autograd::Function<InjectLossFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& loss, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["loss_options"] = at::IValue(loss.scalar_type());
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    at::Tensor g = at::full({}, scale, grads[0].options().dtype(ctx->saved_data["loss_options"].toScalarType()));
    return {grads[0], g, at::Tensor()};
  }
};

struct ScaleGradFn : torch::autograd::Function<ScaleGradFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double scale) {
    ctx->saved_data["scale"] = scale;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0] * ctx->saved_data["scale"].toDouble(), at::Tensor()};
  }
};

// Rows that arrive in blocks by source rank q, each block ordered by local
// expert with counts[q x experts + e] rows of expert e: the permutation that
// groups them by expert (source ranks in order within each), as a device
// index, its inverse, and the rows per expert.
struct ExpertGrouping {
  at::Tensor perm, inverse;
  std::vector<int64_t> per_expert;
};
ExpertGrouping group_by_expert(const std::vector<int64_t>& counts, int ranks, int64_t experts, c10::Device device) {
  ExpertGrouping g;
  g.per_expert.assign(static_cast<size_t>(experts), 0);
  std::vector<int64_t> base(static_cast<size_t>(ranks) + 1, 0), perm;
  for (int q = 0; q < ranks; ++q) {
    base[q + 1] = base[q];
    for (int64_t e = 0; e < experts; ++e) base[q + 1] += counts[q * experts + e];
  }
  perm.reserve(static_cast<size_t>(base[ranks]));
  for (int64_t e = 0; e < experts; ++e) {
    for (int q = 0; q < ranks; ++q) {
      int64_t off = base[q];
      for (int64_t j = 0; j < e; ++j) off += counts[q * experts + j];
      for (int64_t r = 0; r < counts[q * experts + e]; ++r) perm.push_back(off + r);
      g.per_expert[e] += counts[q * experts + e];
    }
  }
  g.perm = at::tensor(perm, at::TensorOptions().dtype(at::kLong)).to(device);
  g.inverse = at::empty_like(g.perm);
  g.inverse.scatter_(0, g.perm, at::arange(g.perm.numel(), g.perm.options()));
  return g;
}

// A layout-free host copy of a small int64 tensor.
std::vector<int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

// ---- config ----------------------------------------------------------------------

void MoEConfig::validate(int ep_size) const {
  TORUS_CHECK(num_experts >= 1, InvalidArgument, "moe: the number of experts must be >= 1, got {}", num_experts);
  TORUS_CHECK(top_k >= 1 && top_k <= num_experts, InvalidArgument,
              "moe: top-k must be between 1 and the number of experts ({}), got {}", num_experts, top_k);
  TORUS_CHECK(ep_size >= 1 && num_experts % ep_size == 0, InvalidArgument,
              "moe: {} experts do not divide evenly over ep={} ranks", num_experts, ep_size);
  TORUS_CHECK(std::isfinite(capacity_factor) && capacity_factor >= 0, InvalidArgument,
              "moe: the capacity factor must be >= 0 (0: dropless), got {}", capacity_factor);
  TORUS_CHECK(aux_loss_weight >= 0 && z_loss_weight >= 0 && bias_update_rate >= 0, InvalidArgument,
              "moe: loss weights and the bias update rate must be >= 0 (aux {}, z {}, rate {})", aux_loss_weight,
              z_loss_weight, bias_update_rate);
  TORUS_CHECK(jitter >= 0 && jitter < 1, InvalidArgument, "moe: jitter must be in [0, 1), got {}", jitter);
  TORUS_CHECK(hidden >= 1 && ffn_hidden >= 1, InvalidArgument, "moe: hidden ({}) and expert width ({}) must be >= 1",
              hidden, ffn_hidden);
}

int64_t MoEConfig::capacity(int64_t tokens) const {
  if (capacity_factor <= 0) return -1;
  const double c = capacity_factor * static_cast<double>(top_k * tokens) / static_cast<double>(num_experts);
  return static_cast<int64_t>(std::ceil(c - 1e-9));
}

// ---- functions -------------------------------------------------------------------

Routing route(const at::Tensor& logits, int64_t top_k, bool normalize_gates, const at::Tensor& bias) {
  TORUS_CHECK(logits.defined() && logits.dim() == 2 && top_k >= 1 && top_k <= logits.size(1), InvalidArgument,
              "moe route: logits must be [tokens, experts] with 1 <= k <= experts (k = {})", top_k);
  Routing r;
  r.logits = logits;
  r.probs = at::softmax(logits, -1);
  at::Tensor select = r.probs.detach();
  if (bias.defined()) select = select + bias.to(select.scalar_type());
  r.experts = std::get<1>(at::topk(select, top_k, -1, /*largest=*/true, /*sorted=*/true));
  at::Tensor gates = r.probs.gather(1, r.experts);
  r.scores = gates.detach();
  if (top_k > 1 && normalize_gates) gates = gates / gates.sum(-1, /*keepdim=*/true);
  r.gates = gates;
  return r;
}

at::Tensor capacity_keep(const at::Tensor& experts, const at::Tensor& scores, const at::Tensor& token_index,
                         int64_t num_experts, int64_t capacity) {
  TORUS_CHECK(experts.dim() == 2 && scores.sizes() == experts.sizes() && token_index.dim() == 1 &&
                  token_index.size(0) == experts.size(0),
              InvalidArgument, "moe capacity_keep: experts and scores must be [m, k] and token_index [m]");
  const int64_t m = experts.size(0), k = experts.size(1);
  auto bool_opts = experts.options().dtype(at::kBool);
  if (capacity < 0) return at::ones({m, k}, bool_opts);
  if (m == 0) return at::zeros({0, k}, bool_opts);
  at::Tensor e = experts.reshape(-1).to(at::kLong);
  at::Tensor s = scores.reshape(-1).to(at::kDouble);
  at::Tensor slot = at::arange(k, e.options()).repeat({m});
  at::Tensor key = token_index.to(at::kLong).unsqueeze(1).expand({m, k}).reshape(-1) * k + slot;
  // Stable sorts from the least significant key: (token, slot) asc, score desc, expert asc.
  at::Tensor perm = std::get<1>(at::sort(key, /*stable=*/true, 0, /*descending=*/false));
  perm = perm.index_select(0, std::get<1>(at::sort(s.index_select(0, perm), true, 0, /*descending=*/true)));
  perm = perm.index_select(0, std::get<1>(at::sort(e.index_select(0, perm), true, 0, false)));
  at::Tensor e_sorted = e.index_select(0, perm);
  at::Tensor counts = at::bincount(e_sorted, {}, num_experts);
  at::Tensor starts = counts.cumsum(0) - counts;
  at::Tensor position = at::arange(m * k, e.options()) - starts.index_select(0, e_sorted);
  at::Tensor keep = at::zeros({m * k}, bool_opts);
  keep.scatter_(0, perm, position.lt(capacity));
  return keep.view({m, k});
}

at::Tensor all_to_all(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                      const comm::ProcessGroupPtr& group) {
  const int n = group_size(group);
  TORUS_CHECK(static_cast<int>(send.size()) == n && static_cast<int>(recv.size()) == n, InvalidArgument,
              "moe all_to_all: {} send and {} receive splits for a group of {}", send.size(), recv.size(), n);
  if (n == 1) {
    TORUS_CHECK(send == recv && x.size(0) == send[0], InvalidArgument,
                "moe all_to_all on one rank: splits {} and {} for {} rows", send[0], recv[0], x.size(0));
    return x;
  }
  return AllToAllFn::apply(x, send, recv, group);
}

at::Tensor inject_loss(const at::Tensor& x, const at::Tensor& loss, double grad_scale) {
  return InjectLossFn::apply(x, loss, grad_scale);
}

at::Tensor scale_grad(const at::Tensor& x, double scale) { return ScaleGradFn::apply(x, scale); }

double token_exchange_seconds() { return static_cast<double>(exchange_ns.load()) * 1e-9; }

// ---- the layer -------------------------------------------------------------------

MoELayer::MoELayer(const MoEConfig& config, std::string name, int64_t layer, const parallel::ParallelGroups& groups,
                   bool sequence_parallel, std::shared_ptr<tp::RngTracker> rng)
    : config_(config),
      name_(std::move(name)),
      layer_(layer),
      groups_(groups),
      sequence_parallel_(sequence_parallel),
      rng_(std::move(rng)) {
  ep_size_ = group_size(groups.ep);
  ep_rank_ = group_rank(groups.ep);
  config_.validate(ep_size_);
  local_experts_ = config_.num_experts / ep_size_;
  first_expert_ = ep_rank_ * local_experts_;
  const int tpn = groups.tp_size(), tpr = groups.tp_rank();
  expert_tp_ = config_.expert_tensor_parallel && tpn > 1;
  TORUS_CHECK(!expert_tp_ || config_.ffn_hidden % tpn == 0, InvalidArgument,
              "{}: expert tensor parallelism splits each expert's width {} over tp={}, which does not divide it", name_,
              config_.ffn_hidden, tpn);
  // Each TP rank routes its own tokens: replicated parameters' gradients are partial over TP.
  const tp::ShardSpec replicated{.tp_partial_grad = tpn > 1};
  const tp::ShardSpec rows = expert_tp_ ? tp::ShardSpec{.dim = 0} : replicated;
  const tp::ShardSpec cols = expert_tp_ ? tp::ShardSpec{.dim = 1} : replicated;
  const auto opts = at::TensorOptions().dtype(config_.dtype).device(config_.device);
  const int64_t E = config_.num_experts, h = config_.hidden, f = config_.ffn_hidden;
  auto normal = [&](const std::string& pname, double std) {
    return tp::InitSpec{tp::InitSpec::Kind::kNormal, std, tp::derive_seed(tp::derive_seed(config_.seed, pname), "weight")};
  };
  // Drawn whole and cut (Note [Layout-independent init]): the same values in every layout.
  auto draw = [&](at::IntArrayRef shape, const tp::ShardSpec& spec, const tp::InitSpec& init) {
    return spec.sharded() ? tp::init_shard(shape, spec, shape[spec.dim], init, tpr, tpn, opts)
                          : tp::init_shard(shape, spec, -1, init, 0, 1, opts);
  };
  auto router = register_module("router", std::make_shared<MoEParameters>(false));
  router_ = router->add("weight", draw({E, h}, replicated, normal(name_ + ".router", config_.init_std)), replicated);
  auto list = register_module("experts", std::make_shared<torch::nn::Module>());
  const tp::InitSpec zeros{tp::InitSpec::Kind::kZeros};
  for (int64_t i = 0; i < local_experts_; ++i) {
    const int64_t e = first_expert_ + i;
    const std::string prefix = name_ + ".experts." + std::to_string(e);
    auto holder = list->register_module(std::to_string(e), std::make_shared<torch::nn::Module>());
    auto fc1 = holder->register_module("fc1", std::make_shared<MoEParameters>(true));
    auto fc2 = holder->register_module("fc2", std::make_shared<MoEParameters>(true));
    Expert x;
    x.fc1_w = fc1->add("weight", draw({f, h}, rows, normal(prefix + ".fc1", config_.init_std)), rows);
    x.fc1_b = fc1->add("bias", draw({f}, rows, zeros), rows);
    x.fc2_w = fc2->add("weight", draw({h, f}, cols, normal(prefix + ".fc2", config_.output_init_std)), cols);
    x.fc2_b = fc2->add("bias", draw({h}, replicated, zeros), replicated);
    experts_.push_back(std::move(x));
  }
  if (config_.aux_loss_free) {
    bias_ = at::zeros({E}, at::TensorOptions().dtype(at::kFloat).device(config_.device));
  }
  acc_.tokens_per_expert.assign(E, 0.0);
}

tp::ShardSpecs MoELayer::shard_specs() const { return {}; }

at::Tensor MoELayer::expert_mlp(int64_t i, const at::Tensor& x, bool bias2) {
  const Expert& e = experts_[i];
  auto w = [&](const at::Tensor& p) { return ep_size_ > 1 ? scale_grad(p, 1.0 / ep_size_) : p; };
  at::Tensor y = at::gelu(at::linear(x, w(e.fc1_w), w(e.fc1_b)), "tanh");
  return bias2 ? at::linear(y, w(e.fc2_w), w(e.fc2_b)) : at::linear(y, w(e.fc2_w));
}

at::Tensor MoELayer::run_experts(const at::Tensor& x, const std::vector<int64_t>& per_expert) {
  std::vector<at::Tensor> outs;
  int64_t off = 0;
  for (int64_t e = 0; e < local_experts_; ++e) {
    outs.push_back(expert_mlp(e, x.narrow(0, off, per_expert[e])));
    off += per_expert[e];
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

at::Tensor MoELayer::run_experts_tp(const at::Tensor& x, const std::vector<int64_t>& per_expert) {
  const int T = groups_.tp_size();
  const int64_t El = local_experts_, m = x.size(0);
  // Every TP rank's rows per local expert: [T x El].
  at::Tensor mine = at::tensor(per_expert, at::TensorOptions().dtype(at::kLong)).to(x.device());
  at::Tensor all = at::empty({T * El}, mine.options());
  at::Tensor mine_alias = tp::detail::comm_alias(mine), all_alias = tp::detail::comm_alias(all);
  groups_.tp->all_gather(mine_alias, all_alias)->wait();
  const std::vector<int64_t> cnt = to_vector(all);
  std::vector<int64_t> rows(T, 0);
  for (int q = 0; q < T; ++q) {
    for (int64_t e = 0; e < El; ++e) rows[q] += cnt[q * El + e];
  }
  // A variable-size all-gather: this rank's rows to every TP rank. The
  // copies' gradients come back with the swapped splits and are summed.
  at::Tensor gathered = all_to_all(x.repeat({T, 1}), std::vector<int64_t>(T, m), rows, groups_.tp);
  // Regroup by expert (rank-major within each): each expert's rows, one matmul.
  const ExpertGrouping g = group_by_expert(cnt, T, El, x.device());
  at::Tensor grouped = gathered.index_select(0, g.perm);
  std::vector<at::Tensor> outs;
  int64_t off = 0;
  for (int64_t e = 0; e < El; ++e) {
    outs.push_back(expert_mlp(e, grouped.narrow(0, off, g.per_expert[e]), /*bias2=*/false));
    off += g.per_expert[e];
  }
  at::Tensor partial = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  // Back to the rank that owns each row, summed over the TP blocks.
  at::Tensor back = all_to_all(partial.index_select(0, g.inverse), rows, std::vector<int64_t>(T, m), groups_.tp);
  at::Tensor y = back.view({T, m, x.size(1)}).sum(0);
  // fc2's bias once per row (replicated; its gradient partial over TP).
  std::vector<at::Tensor> biased;
  off = 0;
  for (int64_t e = 0; e < El; ++e) {
    const at::Tensor& b = experts_[e].fc2_b;
    biased.push_back(y.narrow(0, off, per_expert[e]) + (ep_size_ > 1 ? scale_grad(b, 1.0 / ep_size_) : b));
    off += per_expert[e];
  }
  return biased.size() == 1 ? biased[0] : at::cat(biased, 0);
}

at::Tensor MoELayer::forward(const at::Tensor& x) {
  TORUS_CHECK(x.defined() && x.dim() == 3 && x.size(2) == config_.hidden, InvalidArgument,
              "{}: input must be [seq, batch, {}]", name_, config_.hidden);
  const int tpn = groups_.tp_size(), tpr = groups_.tp_rank();
  const bool split = tpn > 1 && !sequence_parallel_;
  at::Tensor xin = split ? tp::scatter_to_sequence_region(x, groups_.tp) : x;
  const int64_t sl = xin.size(0), b = xin.size(1), h = config_.hidden;
  const int64_t n = sl * b, E = config_.num_experts, k = config_.top_k;
  const int data_size = groups_.dp_size(), data_rank = groups_.dp_rank();
  const int64_t seq = sl * tpn, n_global = seq * b * data_size;
  const bool training = is_training();
  const bool record = training && !parallel::replaying();
  at::Tensor flat = xin.reshape({n, h});
  auto long_opts = at::TensorOptions().dtype(at::kLong).device(x.device());

  // Global token index (row of the micro-batch) x seq + position; local tokens are [sl, b] sequence-first.
  at::Tensor rows = at::arange(b, long_opts) + int64_t{data_rank} * b;
  at::Tensor pos = at::arange(sl, long_opts) + int64_t{tpr} * sl;
  at::Tensor gidx = (rows.unsqueeze(0) * seq + pos.unsqueeze(1)).reshape(-1);

  // Router (fp32).
  at::Tensor rin = flat.to(at::kFloat);
  if (training && config_.jitter > 0) {
    at::Tensor noise = at::empty({n_global, h}, rin.options())
                           .uniform_(1.0 - config_.jitter, 1.0 + config_.jitter,
                                     rng_->generator(tp::RngRegion::kReplicated));
    rin = rin * noise.index_select(0, gidx);
  }
  at::Tensor logits = at::linear(rin, router_.to(at::kFloat));
  Routing rt = route(logits, k, config_.normalize_gates, bias_);

  // Statistics of the whole micro-batch (Note [Layout-independent routing]).
  at::Tensor lse = at::logsumexp(logits, -1);
  at::Tensor counts_local = at::bincount(rt.experts.reshape(-1), {}, E).to(at::kDouble);
  at::Tensor stats;
  if (training) {
    stats = at::cat({counts_local, rt.probs.detach().sum(0).to(at::kDouble), lse.detach().pow(2).sum().to(at::kDouble).view(1)});
    if (groups_.tokens && groups_.tokens->size() > 1) groups_.tokens->all_reduce(stats)->wait();
  }

  // Capacity: every assignment of the group, gathered; each rank keeps its own slice.
  const int64_t capacity = config_.capacity(n_global);
  at::Tensor keep;
  double dropped = 0;
  if (capacity >= 0) {
    at::Tensor mine = at::stack({rt.experts.to(at::kDouble), rt.scores.to(at::kDouble),
                                 gidx.unsqueeze(1).expand({n, k}).to(at::kDouble)},
                                -1)
                          .contiguous();  // [n, k, 3]
    at::Tensor all = mine;
    const int gsize = group_size(groups_.tokens);
    if (gsize > 1) {
      all = at::empty({gsize * n, k, 3}, mine.options());
      groups_.tokens->all_gather(mine, all)->wait();
    }
    at::Tensor all_experts = all.select(2, 0).to(at::kLong);
    at::Tensor all_keep = capacity_keep(all_experts, all.select(2, 1), all.select(2, 2).select(1, 0).to(at::kLong), E,
                                        capacity);
    dropped = static_cast<double>(all_keep.numel() - all_keep.sum().item<int64_t>());
    keep = all_keep.narrow(0, int64_t{group_rank(groups_.tokens)} * n, n);
  }

  // Permutation by expert (stable: ties in token, slot order).
  at::Tensor e_flat = rt.experts.reshape(-1);
  at::Tensor sel = keep.defined() ? at::nonzero(keep.reshape(-1)).squeeze(1) : at::arange(n * k, long_opts);
  at::Tensor e_kept = e_flat.index_select(0, sel);
  at::Tensor order = std::get<1>(at::sort(e_kept, /*stable=*/true, 0, false));
  at::Tensor a_idx = sel.index_select(0, order);
  at::Tensor tok_sorted = at::floor_divide(a_idx, k);
  at::Tensor gate_sorted = rt.gates.reshape(-1).index_select(0, a_idx);
  at::Tensor x_perm = flat.index_select(0, tok_sorted);
  at::Tensor counts = at::bincount(e_kept, {}, E);

  // Exchange the counts, then the tokens.
  const int P = ep_size_;
  const int64_t El = local_experts_;
  at::Tensor recv_counts = counts;
  if (P > 1) {
    at::Tensor send_c = counts.to(at::kLong).contiguous();
    recv_counts = at::empty_like(send_c);
    at::Tensor s_alias = tp::detail::comm_alias(send_c), r_alias = tp::detail::comm_alias(recv_counts);
    groups_.ep->all_to_all(s_alias, r_alias)->wait();
  }
  const std::vector<int64_t> sc = to_vector(counts), rc = to_vector(recv_counts);  // [P x El]
  std::vector<int64_t> send(P, 0), recv(P, 0);
  for (int p = 0; p < P; ++p) {
    for (int64_t e = 0; e < El; ++e) {
      send[p] += sc[p * El + e];
      recv[p] += rc[p * El + e];
    }
  }
  at::Tensor x_recv = all_to_all(x_perm, send, recv, groups_.ep);  // rows by (source rank, local expert)

  // Group the received rows by local expert; run each expert on its rows.
  const ExpertGrouping grp = group_by_expert(rc, P, El, x.device());
  at::Tensor x_grp = x_recv.index_select(0, grp.perm);
  at::Tensor y_grp = expert_tp_ ? run_experts_tp(x_grp, grp.per_expert) : run_experts(x_grp, grp.per_expert);
  at::Tensor y_recv = y_grp.index_select(0, grp.inverse);
  at::Tensor y_back = all_to_all(y_recv, recv, send, groups_.ep);

  // Combine.
  at::Tensor weighted = y_back * gate_sorted.to(y_back.scalar_type()).unsqueeze(1);
  at::Tensor out = at::zeros({n, h}, y_back.options()).index_add(0, tok_sorted, weighted);

  if (training) {
    const double N = static_cast<double>(n_global);
    at::Tensor counts_g = stats.narrow(0, 0, E);
    at::Tensor f = counts_g / (N * static_cast<double>(k));
    at::Tensor P_g = stats.narrow(0, E, E) / N;
    const double aux_value = static_cast<double>(E) * (f * P_g).sum().item<double>();
    const double z_value = stats[2 * E].item<double>() / N;
    at::Tensor loss;
    if (config_.aux_loss_weight > 0) {
      at::Tensor aux_local = (f.to(rt.probs.scalar_type()) * rt.probs.sum(0)).sum() * (static_cast<double>(E) / N);
      loss = aux_local * config_.aux_loss_weight;
    }
    if (config_.z_loss_weight > 0) {
      at::Tensor z_local = lse.pow(2).sum() * (config_.z_loss_weight / N);
      loss = loss.defined() ? loss + z_local : z_local;
    }
    if (loss.defined() && at::GradMode::is_enabled()) {
      out = inject_loss(out, loss, loss_grad_scale_ * static_cast<double>(data_size));
    }
    if (record) {
      const std::vector<int64_t> cg = to_vector(counts_g.round());
      for (int64_t e = 0; e < E; ++e) acc_.tokens_per_expert[e] += static_cast<double>(cg[e]);
      acc_.assignments += N * static_cast<double>(k);
      acc_.dropped += dropped;
      acc_.aux_loss += aux_value;
      acc_.z_loss += z_value;
      acc_.micro_batches += 1;
    }
  }
  out = out.view({sl, b, h});
  if (split) out = tp::gather_from_sequence_region(out, groups_.tp, /*partial_grad=*/false);
  return out;
}

LayerRoutingStats MoELayer::end_step(bool update_bias) {
  LayerRoutingStats s = acc_;
  s.layer = layer_;
  if (update_bias && bias_.defined() && s.micro_batches > 0 && config_.bias_update_rate > 0) {
    at::NoGradGuard no_grad;
    at::Tensor load = at::tensor(s.tokens_per_expert, at::TensorOptions().dtype(at::kDouble));
    at::Tensor delta = at::sign(load.mean() - load) * config_.bias_update_rate;
    bias_.add_(delta.to(bias_.options()));
  }
  acc_ = LayerRoutingStats{};
  acc_.tokens_per_expert.assign(config_.num_experts, 0.0);
  return s;
}

}  // namespace torus::ep
