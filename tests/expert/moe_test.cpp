// The mixture-of-experts layer in one process against plain references
// written here: the drop policy (a loop over experts sorting their
// assignments), the router's top-k, and the whole layer (a loop over tokens
// and their kept assignments through each expert's MLP written from its
// parameters), forward and gradients, with and without the auxiliary and z
// losses; edge cases (one expert, k = E, every token to one expert, zero
// tokens for an expert); the auxiliary-loss-free bias update.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <vector>

#include "torus/core/error.h"
#include "torus/parallel/expert/moe.h"

namespace torus::ep {
namespace {

MoEConfig small_config(int64_t E, int64_t k, double cf) {
  MoEConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.capacity_factor = cf;
  c.hidden = 8;
  c.ffn_hidden = 12;
  c.aux_loss_weight = 0;
  c.init_std = 0.5;  // routers far from uniform
  c.output_init_std = 0.3;
  c.dtype = at::kDouble;
  return c;
}

std::shared_ptr<MoELayer> make_layer(const MoEConfig& c) {
  auto layer = std::make_shared<MoELayer>(c, "moe", 0, parallel::ParallelGroups{}, false,
                                          std::make_shared<tp::RngTracker>(7, 0));
  layer->train();
  return layer;
}

std::map<std::string, at::Tensor> params_of(const MoELayer& layer) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : layer.named_parameters()) out[item.key()] = item.value();
  return out;
}

// keep[i][j] by the rule of Note [Layout-independent routing], written as a
// sort of each expert's (score desc, token asc, slot asc) list.
std::vector<std::vector<bool>> reference_keep(const at::Tensor& experts, const at::Tensor& scores,
                                              const at::Tensor& tokens, int64_t E, int64_t capacity) {
  const int64_t m = experts.size(0), k = experts.size(1);
  std::vector<std::vector<bool>> keep(m, std::vector<bool>(k, capacity < 0));
  if (capacity < 0) return keep;
  for (int64_t e = 0; e < E; ++e) {
    std::vector<std::tuple<double, int64_t, int64_t, int64_t>> list;  // -score, token, slot, row
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        if (experts[i][j].item<int64_t>() != e) continue;
        list.emplace_back(-scores[i][j].item<double>(), tokens[i].item<int64_t>(), j, i);
      }
    }
    std::sort(list.begin(), list.end());
    for (size_t r = 0; r < list.size() && static_cast<int64_t>(r) < capacity; ++r) {
      keep[std::get<3>(list[r])][std::get<2>(list[r])] = true;
    }
  }
  return keep;
}

TEST(MoEDropPolicy, MatchesAPlainSortPerExpert) {
  at::manual_seed(3);
  for (int64_t E : {1, 3, 8}) {
    for (int64_t k : {int64_t{1}, std::min<int64_t>(2, E), E}) {
      for (int64_t capacity : {-1, 0, 1, 3, 7}) {
        const int64_t m = 29;
        at::Tensor experts = at::randint(E, {m, k}, at::TensorOptions().dtype(at::kLong));
        // Scores on a coarse grid: many ties, which the token index breaks.
        at::Tensor scores = at::randint(4, {m, k}, at::TensorOptions().dtype(at::kFloat)) / 4.0;
        at::Tensor tokens = at::randperm(100, at::TensorOptions().dtype(at::kLong)).narrow(0, 0, m);
        at::Tensor keep = capacity_keep(experts, scores, tokens, E, capacity);
        const auto ref = reference_keep(experts, scores, tokens, E, capacity);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < k; ++j) {
            ASSERT_EQ(keep[i][j].item<bool>(), ref[i][j]) << "E " << E << " k " << k << " C " << capacity;
          }
        }
        if (capacity >= 0) {
          // No expert keeps more than C.
          for (int64_t e = 0; e < E; ++e) {
            EXPECT_LE((experts.eq(e) & keep).sum().item<int64_t>(), capacity);
          }
        }
      }
    }
  }
}

TEST(MoERouter, TopKGatesAndBias) {
  at::manual_seed(5);
  at::Tensor logits = at::randn({10, 6}, at::TensorOptions().dtype(at::kDouble));
  Routing r = route(logits, 2, true);
  at::Tensor probs = at::softmax(logits, -1);
  auto [vals, idx] = at::topk(probs, 2, -1);
  EXPECT_TRUE(r.experts.equal(idx));
  EXPECT_TRUE(at::allclose(r.gates, vals / vals.sum(-1, true)));
  EXPECT_TRUE(at::allclose(r.scores, vals));
  Routing raw = route(logits, 2, false);
  EXPECT_TRUE(at::allclose(raw.gates, vals));
  // A bias moves the choice, never the gates' values (probabilities of the chosen).
  at::Tensor bias = at::zeros({6}, at::TensorOptions().dtype(at::kFloat));
  bias[5] = 10;
  Routing b = route(logits, 1, true, bias);
  EXPECT_TRUE(b.experts.eq(5).all().item<bool>());
  EXPECT_TRUE(at::allclose(b.gates.squeeze(1), probs.select(1, 5)));
  EXPECT_THROW(route(logits, 7, true), InvalidArgument);
}

struct Reference {
  at::Tensor out;
  at::Tensor aux;
  at::Tensor z;
  int64_t dropped = 0;
};

// The layer written as a loop over tokens (double precision).
Reference reference_forward(const MoEConfig& c, const std::map<std::string, at::Tensor>& p, const at::Tensor& x,
                            const at::Tensor& bias = {}) {
  const int64_t s = x.size(0), b = x.size(1), h = x.size(2), n = s * b, E = c.num_experts, k = c.top_k;
  at::Tensor flat = x.reshape({n, h});
  at::Tensor logits = at::matmul(flat.to(at::kFloat), p.at("router.weight").to(at::kFloat).t());
  at::Tensor probs = at::softmax(logits, -1);
  at::Tensor sel = probs.detach();
  if (bias.defined()) sel = sel + bias;
  at::Tensor experts = std::get<1>(at::topk(sel, k, -1));
  at::Tensor chosen = probs.gather(1, experts);
  at::Tensor gates = (k > 1 && c.normalize_gates) ? chosen / chosen.sum(-1, true) : chosen;
  // Token t = p * b + row (sequence-first); its global index row * s + p.
  at::Tensor index = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  for (int64_t pos = 0; pos < s; ++pos) {
    for (int64_t row = 0; row < b; ++row) index[pos * b + row] = row * s + pos;
  }
  const auto keep = reference_keep(experts, chosen.detach(), index, E, c.capacity(n));
  std::vector<at::Tensor> rows;
  Reference r;
  for (int64_t t = 0; t < n; ++t) {
    at::Tensor acc = at::zeros({h}, x.options());
    for (int64_t j = 0; j < k; ++j) {
      if (!keep[t][j]) {
        ++r.dropped;
        continue;
      }
      const std::string e = "experts." + std::to_string(experts[t][j].item<int64_t>());
      at::Tensor hdn = at::gelu(at::matmul(p.at(e + ".fc1.weight"), flat[t]) + p.at(e + ".fc1.bias"), "tanh");
      at::Tensor y = at::matmul(p.at(e + ".fc2.weight"), hdn) + p.at(e + ".fc2.bias");
      acc = acc + gates[t][j].to(x.scalar_type()) * y;
    }
    rows.push_back(acc);
  }
  r.out = at::stack(rows).view({s, b, h});
  at::Tensor f = at::zeros({E}, at::TensorOptions().dtype(at::kFloat));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) f[experts[t][j].item<int64_t>()] += 1.0 / static_cast<double>(n * k);
  }
  r.aux = static_cast<double>(E) * (f * probs.mean(0)).sum();
  r.z = at::logsumexp(logits, -1).pow(2).mean();
  return r;
}

void check_layer(const MoEConfig& c, const char* what) {
  SCOPED_TRACE(what);
  at::manual_seed(11);
  auto layer = make_layer(c);
  auto p = params_of(*layer);
  at::Tensor x = at::randn({5, 3, c.hidden}, at::TensorOptions().dtype(at::kDouble)).requires_grad_(true);
  at::Tensor gy = at::randn({5, 3, c.hidden}, x.options());
  at::Tensor y = layer->forward(x);
  (y * gy).sum().backward();
  const LayerRoutingStats st = layer->end_step(false);

  at::Tensor xr = x.detach().clone().requires_grad_(true);
  std::map<std::string, at::Tensor> pr;
  for (const auto& [name, t] : p) pr[name] = t.detach().clone().requires_grad_(true);
  Reference ref = reference_forward(c, pr, xr);
  at::Tensor loss = (ref.out * gy).sum() + ref.aux * c.aux_loss_weight + ref.z * c.z_loss_weight;
  loss.backward();

  EXPECT_TRUE(at::allclose(y, ref.out, 1e-10, 1e-10)) << (y - ref.out).abs().max().item<double>();
  EXPECT_TRUE(at::allclose(x.grad(), xr.grad(), 1e-6, 1e-8)) << (x.grad() - xr.grad()).abs().max().item<double>();
  for (const auto& [name, t] : p) {
    ASSERT_TRUE(t.grad().defined()) << name;
    // The router computes in f32: its gradient is f32-accurate.
    const double tol = name == "router.weight" ? 1e-5 : 1e-9;
    EXPECT_TRUE(at::allclose(t.grad(), pr.at(name).grad(), tol, tol))
        << name << " " << (t.grad() - pr.at(name).grad()).abs().max().item<double>();
  }
  EXPECT_EQ(st.micro_batches, 1);
  EXPECT_DOUBLE_EQ(st.assignments, 15.0 * c.top_k);
  EXPECT_DOUBLE_EQ(st.dropped, static_cast<double>(ref.dropped));
  EXPECT_NEAR(st.aux_loss, ref.aux.item<double>(), 1e-6);
  EXPECT_NEAR(st.z_loss, ref.z.item<double>(), 1e-5);
  double total = 0;
  for (double v : st.tokens_per_expert) total += v;
  EXPECT_DOUBLE_EQ(total, st.assignments);
}

TEST(MoELayer, DroplessMatchesTheTokenLoop) { check_layer(small_config(4, 2, 0), "E4 k2 dropless"); }
TEST(MoELayer, CapacityMatchesTheTokenLoop) {
  check_layer(small_config(4, 2, 1.0), "E4 k2 cf1");
  check_layer(small_config(4, 1, 0.5), "E4 k1 cf0.5 (most tokens dropped)");
}
TEST(MoELayer, AuxAndZLossGradientsReachTheRouter) {
  MoEConfig c = small_config(4, 2, 1.25);
  c.aux_loss_weight = 0.5;
  c.z_loss_weight = 0.1;
  check_layer(c, "aux 0.5 z 0.1");
}
TEST(MoELayer, OneExpertAndKEqualsE) {
  check_layer(small_config(1, 1, 0), "one expert");
  check_layer(small_config(1, 1, 1.0), "one expert, capacity");
  check_layer(small_config(3, 3, 0), "k = E");
  check_layer(small_config(3, 3, 1.0), "k = E, capacity");
}

TEST(MoELayer, EveryTokenToOneExpertDropsTheRestAndIdleExpertsGetZeroGradients) {
  MoEConfig c = small_config(4, 1, 1.0);
  c.aux_loss_free = true;
  auto layer = make_layer(c);
  {
    at::NoGradGuard g;
    const_cast<at::Tensor&>(layer->bias())[2] = 100.0;  // selection only: every token picks expert 2
  }
  at::manual_seed(2);
  at::Tensor x = at::randn({4, 2, c.hidden}, at::TensorOptions().dtype(at::kDouble)).requires_grad_(true);
  at::Tensor y = layer->forward(x);
  y.sum().backward();
  const LayerRoutingStats st = layer->end_step(true);
  EXPECT_EQ(st.tokens_per_expert[2], 8.0);
  // C = ceil(1.0 x 1 x 8 / 4) = 2 kept, 6 dropped: their rows are zero.
  EXPECT_EQ(st.dropped, 6.0);
  EXPECT_EQ(y.reshape({8, c.hidden}).abs().sum(1).gt(0).sum().item<int64_t>(), 2);
  EXPECT_DOUBLE_EQ(st.imbalance(), 4.0);
  auto p = params_of(*layer);
  EXPECT_TRUE(p.at("experts.0.fc1.weight").grad().defined());
  EXPECT_EQ(p.at("experts.0.fc1.weight").grad().abs().sum().item<double>(), 0.0);
  EXPECT_GT(p.at("experts.2.fc1.weight").grad().abs().sum().item<double>(), 0.0);
  // The bias update: the overloaded expert goes down by the rate, the idle ones up.
  EXPECT_NEAR(layer->bias()[2].item<double>(), 100.0 - c.bias_update_rate, 1e-4);
  EXPECT_NEAR(layer->bias()[0].item<double>(), c.bias_update_rate, 1e-7);
  // The check against the token loop with the same bias.
  auto pr = params_of(*layer);
  Reference ref = reference_forward(c, pr, x.detach(), layer->bias().clone());
  at::Tensor y2 = layer->forward(x.detach());
  EXPECT_TRUE(at::allclose(y2, ref.out, 1e-10, 1e-10));
}

TEST(MoELayer, EvaluationRecordsNothingAndBadConfigsAreRefused) {
  MoEConfig c = small_config(4, 2, 0);
  auto layer = make_layer(c);
  layer->eval();
  at::NoGradGuard g;
  at::Tensor y = layer->forward(at::randn({2, 2, c.hidden}, at::TensorOptions().dtype(at::kDouble)));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 2, c.hidden}));
  EXPECT_EQ(layer->end_step(false).micro_batches, 0);
  MoEConfig bad = c;
  bad.top_k = 5;
  EXPECT_THROW(bad.validate(1), InvalidArgument);
  bad = c;
  EXPECT_THROW(bad.validate(3), InvalidArgument);  // 4 experts over 3 ranks
  bad.capacity_factor = -1;
  EXPECT_THROW(bad.validate(1), InvalidArgument);
  EXPECT_EQ(c.capacity(100), -1);
  MoEConfig cap = c;
  cap.capacity_factor = 1.25;
  EXPECT_EQ(cap.capacity(64), 40);  // ceil(1.25 x 2 x 64 / 4)
}

}  // namespace
}  // namespace torus::ep
