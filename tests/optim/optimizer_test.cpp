// torus::optim optimizers on one process. References are independent: the
// torch::optim C++ frontend (element-wise ops, no fused kernels) for the
// update rules, and closed-form or bit-level expectations for the seam
// (state_dict, skipped steps, master weights, eager state, errors).
//
// Tolerances: f64 runs agree with torch::optim to 1e-12 relative (the
// kernels differ only in the rounding of a few operations per element); f32
// runs to 2e-6 (a few ulps after 8 steps of lr-sized changes). Runs that use
// the same kernels on the same values (master weights against an f32 run,
// state_dict resumes, eager vs lazy state) must be bit-identical.
#include "torus/optim/optimizer.h"

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <string>

#include "torus/core/error.h"
#include "torus/optim/adam.h"
#include "torus/optim/adamw.h"
#include "torus/optim/sgd.h"

namespace torus::optim {
namespace {

double rel(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>()) / (scale > 0 ? scale : 1.0);
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

std::vector<at::Tensor> make_params(at::ScalarType dtype, uint64_t seed = 7) {
  at::manual_seed(seed);
  std::vector<at::Tensor> ps;
  for (std::vector<int64_t> shape : {std::vector<int64_t>{16, 9}, {9}, {5, 4, 3}, {7}}) {
    ps.push_back(at::randn(shape, at::TensorOptions().dtype(dtype)).requires_grad_());
  }
  return ps;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

std::map<std::string, at::Tensor> snapshot(const std::map<std::string, at::Tensor>& sd) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [k, v] : sd) out[k] = v.clone();
  return out;
}

bool same_state(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || !same(v, it->second)) return false;
  }
  return true;
}

// Groups {0, 2} and {1, 3}: ours built by `make_ours`, the reference by
// `make_ref`. Random gradients for `steps` steps (parameter 3 has none at
// step 2), lr changed at step 4 through set_lr / the reference's group lrs.
using MakeOurs = std::function<std::unique_ptr<Optimizer>(std::vector<at::Tensor>)>;
using MakeRef = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

void compare_with_torch(at::ScalarType dtype, double tol, const MakeOurs& make_ours, const MakeRef& make_ref,
                        const std::function<void(torch::optim::Optimizer&, double)>& ref_set_lr, int steps = 8) {
  std::vector<at::Tensor> ours = make_params(dtype), ref = clones(ours);
  auto opt = make_ours(ours);
  auto torch_opt = make_ref(ref);
  const double lr0 = opt->lr();
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < ours.size(); ++i) {
      if (step == 2 && i == 3) continue;  // no gradient this step: skipped by both
      at::Tensor g = at::randn(ours[i].sizes(), at::TensorOptions().dtype(dtype));
      ours[i].mutable_grad() = g.clone();
      ref[i].mutable_grad() = g.clone();
    }
    if (step == 4) {
      opt->set_lr(lr0 * 0.5);
      ref_set_lr(*torch_opt, 0.5);
    }
    opt->step();
    torch_opt->step();
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_LE(rel(ours[i].detach(), ref[i].detach()), tol) << opt->name() << " step " << step << " param " << i;
      ours[i].mutable_grad() = at::Tensor();
      ref[i].mutable_grad() = at::Tensor();
    }
  }
  EXPECT_EQ(opt->step_count(), steps);
  EXPECT_EQ(opt->step_count(0, 0), steps);
  EXPECT_EQ(opt->step_count(1, 1), steps - 1);  // skipped once
}

// Scales every reference group's lr (torch::optim keeps an absolute lr per group).
template <class Options>
void scale_ref_lr(torch::optim::Optimizer& o, double factor) {
  for (auto& g : o.param_groups()) {
    auto& opts = static_cast<Options&>(g.options());
    opts.lr(opts.lr() * factor);
  }
}

struct SGDCase {
  double momentum, dampening, wd_a, wd_b;
  bool nesterov;
};

void sgd_case(at::ScalarType dtype, double tol, const SGDCase& c) {
  using RefOptions = torch::optim::SGDOptions;
  compare_with_torch(
      dtype, tol,
      [&](std::vector<at::Tensor> p) {
        return std::make_unique<SGD>(
            std::vector<ParamGroup>{{.params = {p[0], p[2]}, .weight_decay = c.wd_a},
                                    {.params = {p[1], p[3]}, .weight_decay = c.wd_b, .lr_scale = 0.25}},
            SGDOptions{.lr = 0.1, .momentum = c.momentum, .dampening = c.dampening, .nesterov = c.nesterov});
      },
      [&](std::vector<at::Tensor> p) {
        auto o = [&](double lr, double wd) {
          return std::make_unique<RefOptions>(
              RefOptions(lr).momentum(c.momentum).dampening(c.dampening).nesterov(c.nesterov).weight_decay(wd));
        };
        std::vector<torch::optim::OptimizerParamGroup> groups;
        groups.emplace_back(std::vector<at::Tensor>{p[0], p[2]}, o(0.1, c.wd_a));
        groups.emplace_back(std::vector<at::Tensor>{p[1], p[3]}, o(0.025, c.wd_b));
        return std::make_unique<torch::optim::SGD>(groups, RefOptions(0.1));
      },
      scale_ref_lr<RefOptions>);
}

TEST(SGD, MatchesTorchSGD) {
  const SGDCase cases[] = {{0.0, 0.0, 0.0, 0.0, false},    // plain
                           {0.9, 0.0, 0.0, 0.0, false},    // momentum
                           {0.9, 0.0, 0.01, 0.0, true},    // Nesterov, weight decay on one group
                           {0.8, 0.3, 0.05, 0.1, false}};  // dampening
  for (const auto& c : cases) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + " dampening " + std::to_string(c.dampening) +
                 (c.nesterov ? " nesterov" : ""));
    sgd_case(at::kDouble, 1e-12, c);
    sgd_case(at::kFloat, 2e-6, c);
  }
}

void adam_case(at::ScalarType dtype, double tol, bool decoupled) {
  using RefAdam = torch::optim::AdamOptions;
  using RefAdamW = torch::optim::AdamWOptions;
  auto ours = [&](std::vector<at::Tensor> p) -> std::unique_ptr<Optimizer> {
    std::vector<ParamGroup> groups{
        {{p[0], p[2]}, 0.1}, {.params = {p[1], p[3]}, .weight_decay = 0.0, .lr_scale = 2.0, .beta1 = 0.8, .eps = 1e-6}};
    const AdamOptions o{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    if (decoupled) return std::make_unique<AdamW>(std::move(groups), o);
    return std::make_unique<Adam>(std::move(groups), o);
  };
  auto ref = [&](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (decoupled) {
      groups.emplace_back(std::vector<at::Tensor>{p[0], p[2]},
                          std::make_unique<RefAdamW>(RefAdamW(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
      groups.emplace_back(std::vector<at::Tensor>{p[1], p[3]},
                          std::make_unique<RefAdamW>(RefAdamW(2e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0)));
      return std::make_unique<torch::optim::AdamW>(groups, RefAdamW(1e-2));
    }
    groups.emplace_back(std::vector<at::Tensor>{p[0], p[2]},
                        std::make_unique<RefAdam>(RefAdam(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
    groups.emplace_back(std::vector<at::Tensor>{p[1], p[3]},
                        std::make_unique<RefAdam>(RefAdam(2e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0)));
    return std::make_unique<torch::optim::Adam>(groups, RefAdam(1e-2));
  };
  if (decoupled) {
    compare_with_torch(dtype, tol, ours, ref, scale_ref_lr<RefAdamW>);
  } else {
    compare_with_torch(dtype, tol, ours, ref, scale_ref_lr<RefAdam>);
  }
}

TEST(Adam, MatchesTorchAdam) {
  adam_case(at::kDouble, 1e-12, false);
  adam_case(at::kFloat, 2e-6, false);
}

TEST(AdamW, MatchesTorchAdamW) {
  adam_case(at::kDouble, 1e-12, true);
  adam_case(at::kFloat, 2e-6, true);
}

TEST(Optimizer, FactoryBuildsTheNamedAlgorithm) {
  for (const char* name : {"sgd", "adam", "adamw"}) {
    std::vector<at::Tensor> a = make_params(at::kDouble), b = clones(a);
    OptimizerSpec spec{.name = name, .lr = 0.05, .beta2 = 0.9, .momentum = 0.5, .weight_decay = 0.01};
    auto made = make_optimizer(spec, {{a}});
    std::unique_ptr<Optimizer> direct;
    if (spec.name == "sgd")
      direct = std::make_unique<SGD>(std::vector<ParamGroup>{{b}},
                                     SGDOptions{.lr = 0.05, .momentum = 0.5, .weight_decay = 0.01});
    if (spec.name == "adam")
      direct = std::make_unique<Adam>(std::vector<ParamGroup>{{b}},
                                      AdamOptions{.lr = 0.05, .beta2 = 0.9, .weight_decay = 0.01});
    if (spec.name == "adamw")
      direct = std::make_unique<AdamW>(std::vector<ParamGroup>{{b}},
                                       AdamWOptions{.lr = 0.05, .beta2 = 0.9, .weight_decay = 0.01});
    EXPECT_EQ(made->name(), name);
    for (int s = 0; s < 3; ++s) {
      for (size_t i = 0; i < a.size(); ++i) {
        a[i].mutable_grad() = at::randn_like(a[i]);
        b[i].mutable_grad() = a[i].grad().clone();
      }
      made->step();
      direct->step();
    }
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same(a[i], b[i])) << name << " param " << i;
    EXPECT_EQ(made->hyperparameters(0).at("weight_decay"), 0.01);
  }
  EXPECT_THROW(make_optimizer({.name = "lamb"}, {}), InvalidArgument);
  EXPECT_THROW((OptimizerSpec{.name = "sgd", .nesterov = true}).validate(), InvalidArgument);
  EXPECT_THROW((OptimizerSpec{.name = "adam", .beta1 = 1.0}).validate(), InvalidArgument);
  EXPECT_NO_THROW((OptimizerSpec{.name = "adamw"}).validate());
}

TEST(Optimizer, HyperparametersPerGroup) {
  std::vector<at::Tensor> p = make_params(at::kFloat);
  AdamW opt({{{p[0]}, 0.1}, {.params = {p[1]}, .lr_scale = 0.5, .beta2 = 0.9}}, {.lr = 2e-3, .weight_decay = 0.01});
  auto h0 = opt.hyperparameters(0), h1 = opt.hyperparameters(1);
  EXPECT_EQ(h0.at("lr"), 2e-3);
  EXPECT_EQ(h0.at("weight_decay"), 0.1);
  EXPECT_EQ(h0.at("beta2"), 0.999);
  EXPECT_EQ(h1.at("lr"), 1e-3);
  EXPECT_EQ(h1.at("lr_scale"), 0.5);
  EXPECT_EQ(h1.at("weight_decay"), 0.01);  // the optimizer's default
  EXPECT_EQ(h1.at("beta2"), 0.9);
  opt.step(4e-3);  // no gradients: only the lr and the count change
  EXPECT_EQ(opt.lr(), 4e-3);
  EXPECT_EQ(opt.group_lr(1), 2e-3);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_EQ(opt.step_count(0, 0), 0);
  EXPECT_FALSE(opt.state(0, 0, "exp_avg").defined());
  EXPECT_THROW(opt.state(0, 0, "momentum_buffer"), InvalidArgument);
  SGD sgd({{{p[2]}}, {.params = {p[3]}, .momentum = 0.9, .nesterov = true}}, {.lr = 0.1});
  EXPECT_EQ(sgd.hyperparameters(1).at("nesterov"), 1.0);
  EXPECT_TRUE(sgd.buffer_names(0).empty());
  EXPECT_EQ(sgd.buffer_names(1), std::vector<std::string>{"momentum_buffer"});
}

// ---- state -------------------------------------------------------------------------

void set_grads(std::vector<at::Tensor>& ps, uint64_t seed) {
  at::manual_seed(seed);
  for (auto& p : ps) p.mutable_grad() = at::randn(p.sizes(), at::TensorOptions().dtype(p.scalar_type()));
}

std::vector<ParamGroup> named_groups(const std::vector<at::Tensor>& p) {
  return {{.params = {p[0], p[2]}, .weight_decay = 0.1, .names = {"w0", "w2"}},
          {.params = {p[1], p[3]}, .weight_decay = 0.0, .momentum = 0.5, .names = {"b1", "b3"}}};
}

TEST(Optimizer, StateDictRoundTripResumesIdentically) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    std::vector<at::Tensor> a = make_params(dtype);
    SGD opt_a(named_groups(a), {.lr = 0.1, .momentum = 0.9, .dampening = 0.1});
    for (int s = 0; s < 3; ++s) {
      set_grads(a, 100 + s);
      opt_a.step();
    }
    const auto saved = snapshot(opt_a.state_dict());
    EXPECT_EQ(saved.count("w0.step"), 1u);
    EXPECT_EQ(saved.count("b3.momentum_buffer"), 1u);
    EXPECT_EQ(saved.count("w2.master"), dtype == at::kBFloat16 ? 1u : 0u);
    EXPECT_EQ(saved.at("step_count").item<int64_t>(), 3);
    std::vector<at::Tensor> b = clones(a);
    for (int s = 3; s < 6; ++s) {
      set_grads(a, 100 + s);
      opt_a.step();
    }
    // A new optimizer over the parameters as they were, with the saved state.
    SGD opt_b(named_groups(b), {.lr = 0.1, .momentum = 0.9, .dampening = 0.1});
    opt_b.load_state_dict(saved);
    EXPECT_EQ(opt_b.step_count(), 3);
    EXPECT_EQ(opt_b.step_count(1, 0), 3);
    for (int s = 3; s < 6; ++s) {
      set_grads(b, 100 + s);
      opt_b.step();
    }
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same(a[i], b[i])) << "param " << i;
    EXPECT_TRUE(same_state(opt_a.state_dict(), opt_b.state_dict()));
  }
}

TEST(Optimizer, LoadRejectsBadStateAndChangesNothing) {
  std::vector<at::Tensor> p = make_params(at::kFloat);
  p[3] = p[3].detach().to(at::kBFloat16).requires_grad_();  // one parameter with a master copy
  auto groups = [&] { return std::vector<ParamGroup>{{.params = p, .names = {"a", "b", "c", "d"}}}; };
  AdamW opt(groups(), {.lr = 1e-2});
  set_grads(p, 1);
  opt.step();
  const auto good = snapshot(opt.state_dict());
  const auto params_before = clones(p);
  auto expect_rejected = [&](const std::map<std::string, at::Tensor>& bad, const std::string& needle) {
    const std::string msg = what_of([&] { opt.load_state_dict(bad); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
    EXPECT_TRUE(same_state(opt.state_dict(), good)) << needle;
    for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(same(p[i], params_before[i]));
  };
  auto with = [&](const std::string& key, at::Tensor t) {
    auto sd = snapshot(good);
    if (t.defined()) {
      sd[key] = t;
    } else {
      sd.erase(key);
    }
    return sd;
  };
  // Bad values first in iteration order, good ones after: nothing may change.
  expect_rejected(with("step_count", at::Tensor()), "'step_count'");
  expect_rejected(with("step_count", at::scalar_tensor(1.0, at::kDouble)), "'step_count' is f64, expected i64");
  expect_rejected(with("d.exp_avg", at::zeros({8})), "'d.exp_avg' has shape [8], expected [7]");
  expect_rejected(with("d.exp_avg", at::zeros({7}, at::kBFloat16)), "'d.exp_avg' is bf16, expected f32");
  expect_rejected(with("a.exp_avg_sq", at::zeros({16, 9}, at::kDouble)), "'a.exp_avg_sq' is f64, expected f32");
  expect_rejected(with("d.master", at::Tensor()), "no 'd.master'");
  expect_rejected(with("a.master", at::zeros({16, 9})), "'a.master' is given");
  expect_rejected(with("c.exp_avg", at::Tensor()), "no 'c.exp_avg'");
  expect_rejected(with("b.step", at::scalar_tensor(1.5, at::kFloat)), "'b.step' is 1.5");
  expect_rejected(with("zz.exp_avg", at::zeros({1})), "'zz.exp_avg'");
  auto partial = snapshot(good);
  partial.erase("b.step");
  expect_rejected(partial, "'b.exp_avg' is given without 'b.step'");
  // A different optimizer's names.
  AdamW other({{p}}, {});
  EXPECT_NE(what_of([&] { other.load_state_dict(good); }).find("named like 'g0.p0'"), std::string::npos);
  // And the good one loads (also from itself: the tensors alias the state).
  EXPECT_NO_THROW(opt.load_state_dict(good));
  EXPECT_NO_THROW(opt.load_state_dict(opt.state_dict()));
  EXPECT_TRUE(same_state(opt.state_dict(), good));
  // Only the step count: every parameter back to no state.
  opt.load_state_dict({{"step_count", at::scalar_tensor(5, at::kLong)}});
  EXPECT_EQ(opt.state_dict().size(), 1u);
  EXPECT_EQ(opt.step_count(), 5);
  EXPECT_EQ(opt.step_count(0, 0), 0);
}

TEST(Optimizer, SkippedStepLeavesEverythingBitIdentical) {
  std::vector<at::Tensor> p = make_params(at::kBFloat16);
  Adam opt({{{p[0], p[1]}, 0.1}, {{p[2], p[3]}, 0.0}}, {.lr = 1e-2});
  set_grads(p, 3);
  opt.step();
  auto state = snapshot(opt.state_dict());
  auto params = clones(p);
  // A step that is not taken (the trainer's non-finite norm): nothing moves.
  set_grads(p, 4);
  p[1].mutable_grad()[0] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(same_state(opt.state_dict(), state));
  EXPECT_EQ(opt.step_count(), 1);
  // A step that throws on a bad gradient (the last parameter's) changes nothing either.
  p[3].mutable_grad() = at::zeros({8}, at::kBFloat16);
  EXPECT_NE(what_of([&] { opt.step(); }).find("the gradient of 'g1.p1' has shape [8], the parameter [7]"),
            std::string::npos);
  p[3].mutable_grad() = at::zeros({7}, at::kInt);
  EXPECT_NE(what_of([&] { opt.step(); }).find("is i32"), std::string::npos);
  EXPECT_TRUE(same_state(opt.state_dict(), state));
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(same(p[i], params[i]));
  EXPECT_EQ(opt.step_count(), 1);
  // Parameters without a gradient keep their values, state and count.
  for (auto& x : p) x.mutable_grad() = at::Tensor();
  p[0].mutable_grad() = at::randn({16, 9}).to(at::kBFloat16);
  opt.step();
  EXPECT_EQ(opt.step_count(), 2);
  EXPECT_EQ(opt.step_count(0, 0), 2);
  EXPECT_EQ(opt.step_count(0, 1), 1);
  const auto after = opt.state_dict();
  for (const std::string k : {"g0.p1.", "g1.p0.", "g1.p1."}) {
    for (const std::string s : {"step", "exp_avg", "exp_avg_sq", "master"}) {
      EXPECT_TRUE(same(after.at(k + s), state.at(k + s))) << k << s;
    }
  }
  for (size_t i = 1; i < p.size(); ++i) EXPECT_TRUE(same(p[i], params[i]));
  EXPECT_FALSE(same(p[0], params[0]));
}

// bf16 parameters with fp32 masters against the same optimizer on f32
// parameters holding the same values with the same (upcast) gradients: the
// same kernel runs on the same numbers, so the masters equal the f32 run bit
// for bit, and each bf16 parameter is its master rounded to nearest even.
template <class Opt, class Options>
void master_weights_case(const Options& options) {
  std::vector<at::Tensor> half = make_params(at::kBFloat16), full;
  for (const auto& h : half) full.push_back(h.detach().to(at::kFloat).requires_grad_());
  Opt ours({{{half[0], half[2]}, 0.1}, {{half[1], half[3]}, 0.0}}, options);
  Opt ref({{{full[0], full[2]}, 0.1}, {{full[1], full[3]}, 0.0}}, options);
  for (int s = 0; s < 10; ++s) {
    for (size_t i = 0; i < half.size(); ++i) {
      half[i].mutable_grad() = at::randn(half[i].sizes()).to(at::kBFloat16);
      full[i].mutable_grad() = half[i].grad().to(at::kFloat);
    }
    ours.step();
    ref.step();
  }
  for (size_t i = 0; i < half.size(); ++i) {
    const size_t g = i % 2, j = i / 2;
    ASSERT_TRUE(ours.has_master(g, j));
    const at::Tensor master = ours.state(g, j, "master");
    EXPECT_EQ(master.scalar_type(), at::kFloat);
    EXPECT_TRUE(same(master, full[i].detach())) << "param " << i;
    EXPECT_TRUE(same(half[i].detach(), full[i].detach().to(at::kBFloat16))) << "param " << i;
    for (const auto& b : ours.buffer_names(g)) EXPECT_EQ(ours.state(g, j, b).scalar_type(), at::kFloat) << b;
  }
  // And the master matters: updating in bf16 drifts away from the f32 run.
  EXPECT_GT(rel(half[0].detach(), full[0].detach()), 0.0);
}

TEST(Optimizer, MasterWeightsFollowAnF32Run) {
  master_weights_case<AdamW>(AdamWOptions{.lr = 1e-2, .beta2 = 0.95});
  master_weights_case<Adam>(AdamOptions{.lr = 1e-2});
  master_weights_case<SGD>(SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
}

TEST(Optimizer, MasterWeightModes) {
  std::vector<at::Tensor> p = {at::randn({4}).requires_grad_(), at::randn({4}, at::kDouble).requires_grad_(),
                               at::randn({4}).to(at::kHalf).requires_grad_()};
  AdamW always({{p}}, {}, {.master_weights = MasterWeights::kAlways});
  EXPECT_TRUE(always.has_master(0, 0));
  EXPECT_FALSE(always.has_master(0, 1));  // never for f64
  EXPECT_TRUE(always.has_master(0, 2));
  std::vector<at::Tensor> q = clones(p);
  AdamW never({{q}}, {}, {.master_weights = MasterWeights::kNever});
  EXPECT_FALSE(never.has_master(0, 2));
  never.init_state();
  EXPECT_EQ(never.state(0, 2, "exp_avg").scalar_type(), at::kHalf);
  EXPECT_FALSE(never.state(0, 2, "master").defined());
  // kAlways on f32 is a copy that changes nothing: the same results as kHalf.
  std::vector<at::Tensor> r = clones(p);
  AdamW half({{r}}, {});
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < p.size(); ++i) {
      p[i].mutable_grad() = at::randn_like(p[i]);
      r[i].mutable_grad() = p[i].grad().clone();
    }
    always.step();
    half.step();
  }
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(same(p[i], r[i])) << i;
}

TEST(Optimizer, GradProviderSuppliesGradients) {
  // bf16 parameters whose fp32 "main gradients" live elsewhere, against the same
  // gradients given as bf16 .grad: the provider's fp32 values are used as they
  // are (not rounded to bf16 first).
  std::vector<at::Tensor> p = make_params(at::kBFloat16), q = clones(p);
  std::map<const void*, at::Tensor> main_grads;
  AdamW a({{p, 0.1}}, {.lr = 1e-2});
  AdamW b({{q, 0.1}}, {.lr = 1e-2});
  a.set_grad_provider([&](const at::Tensor& param) {
    auto it = main_grads.find(param.unsafeGetTensorImpl());
    return it == main_grads.end() ? at::Tensor() : it->second;
  });
  for (int s = 0; s < 3; ++s) {
    main_grads.clear();
    for (size_t i = 0; i < p.size(); ++i) {
      if (s == 1 && i == 2) continue;  // the provider has nothing for it: skipped
      at::Tensor g = at::randn(p[i].sizes()).to(at::kBFloat16).to(at::kFloat);
      main_grads[p[i].unsafeGetTensorImpl()] = g;
      q[i].mutable_grad() = g.to(at::kBFloat16);
      p[i].mutable_grad() = at::full_like(p[i], 1e4);  // ignored: the provider decides
    }
    a.step();
    b.step();
    for (auto& t : q) t.mutable_grad() = at::Tensor();
  }
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(same(p[i], q[i])) << i;
  EXPECT_EQ(a.step_count(0, 2), 2);
  a.set_grad_provider(nullptr);  // back to .grad
  p[0].mutable_grad() = at::zeros({3}, at::kBFloat16);
  EXPECT_THROW(a.step(), InvalidArgument);
}

TEST(Optimizer, EagerStateEqualsLazyState) {
  std::vector<at::Tensor> a = make_params(at::kFloat), b = clones(a);
  // Dampening makes SGD's first-step rule visible: buf = g, not (1 - d) g.
  SGD lazy({{a, 0.01}}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  SGD eager({{b, 0.01}}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  eager.init_state();
  EXPECT_FALSE(lazy.state(0, 0, "momentum_buffer").defined());
  ASSERT_TRUE(eager.state(0, 0, "momentum_buffer").defined());
  EXPECT_EQ(eager.state(0, 0, "momentum_buffer").abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(eager.step_count(0, 0), 0);
  EXPECT_EQ(eager.state_dict().size(), 1 + 2 * a.size());  // step_count, then step and momentum_buffer
  for (int s = 0; s < 3; ++s) {
    set_grads(a, 50 + s);
    set_grads(b, 50 + s);
    lazy.step();
    eager.step();
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same(a[i], b[i])) << i;
  EXPECT_TRUE(same_state(lazy.state_dict(), eager.state_dict()));
}

TEST(Optimizer, RejectsBadParametersAndOptions) {
  at::Tensor p = at::zeros({3}).requires_grad_(), q = at::zeros({3}).requires_grad_();
  EXPECT_THROW(AdamW({{{p}, 0.0}}, {.lr = -1}), InvalidArgument);
  EXPECT_THROW(AdamW({{{p}, 0.0}}, {.beta1 = 1.0}), InvalidArgument);
  EXPECT_THROW(AdamW({{{p}, 0.0}}, {.eps = 0}), InvalidArgument);
  EXPECT_THROW(AdamW({{{p}, -0.1}}, {}), InvalidArgument);
  EXPECT_THROW(Adam({{.params = {p}, .beta2 = 1.5}}, {}), InvalidArgument);
  EXPECT_THROW(SGD({{{p}}}, {.momentum = -0.1}), InvalidArgument);
  EXPECT_THROW(SGD({{{p}}}, {.dampening = 2}), InvalidArgument);
  EXPECT_THROW(SGD({{{p}}}, {.nesterov = true}), InvalidArgument);  // no momentum
  EXPECT_THROW(SGD({{{p}}}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}), InvalidArgument);
  EXPECT_THROW(SGD({{.params = {p}, .nesterov = true}}, {.momentum = 0}), InvalidArgument);  // a group's override
  EXPECT_NE(what_of([&] { Adam({{.params = {p}, .momentum = 0.9}}, {}); }).find("Adam does not use"),
            std::string::npos);
  EXPECT_NE(what_of([&] { SGD({{.params = {p}, .beta1 = 0.9}}, {}); }).find("SGD does not use"), std::string::npos);
  EXPECT_THROW(SGD({{.params = {p}, .lr_scale = -1}}, {}), InvalidArgument);
  EXPECT_THROW(SGD({{.params = {p, q}, .names = {"x"}}}, {}), InvalidArgument);
  EXPECT_NE(what_of([&] {
              SGD({{.params = {p}, .names = {"x"}}, {.params = {q}, .names = {"x"}}}, {});
            }).find("two parameters are named 'x'"),
            std::string::npos);
  EXPECT_THROW(SGD({{{at::Tensor()}}}, {}), InvalidArgument);
  EXPECT_THROW(SGD({{{at::zeros({3}, at::kLong)}}}, {}), InvalidArgument);
  SGD ok({{{p}}}, {});
  EXPECT_THROW(ok.set_lr(-1e-3), InvalidArgument);
  EXPECT_THROW(ok.set_lr(std::numeric_limits<double>::quiet_NaN()), InvalidArgument);
}

TEST(Optimizer, RejectsAParameterListedTwiceOrSharedMemory) {
  at::Tensor p = at::zeros({4, 3}).requires_grad_(), q = at::zeros({3}).requires_grad_();
  EXPECT_NE(what_of([&] { AdamW({{{p, q, p}, 0.0}}, {}); }).find("listed twice"), std::string::npos);
  EXPECT_NE(what_of([&] { AdamW({{{p}, 0.0}, {{q, p}, 0.1}}, {}); }).find("listed twice"), std::string::npos);
  // Another TensorImpl over the same memory (what a binding hands over).
  at::Tensor alias = at::empty({0}).set_(p.storage(), p.storage_offset(), p.sizes(), p.strides());
  EXPECT_NE(what_of([&] { AdamW({{{p, q}}, {{alias}}}, {}); }).find("listed twice"), std::string::npos);
  // Overlapping views of one buffer.
  at::Tensor flat = at::zeros({10});
  EXPECT_NE(what_of([&] {
              SGD({{{flat.narrow(0, 0, 6), flat.narrow(0, 4, 6)}}}, {});
            }).find("share memory"),
            std::string::npos);
  // Disjoint views of one buffer are fine (a flat parameter buffer).
  EXPECT_NO_THROW(SGD({{{flat.narrow(0, 0, 5), flat.narrow(0, 5, 5)}}}, {}));
}

// The CUDA kernels against the CPU ones (f32, and bf16 with fp32 masters),
// with a first-step batch and a later one (SGD's two code paths).
TEST(Optimizer, CudaMatchesCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    std::vector<at::Tensor> cpu = make_params(dtype), gpu;
    for (const auto& p : cpu) gpu.push_back(p.detach().to(at::kCUDA).requires_grad_());
    for (const char* name : {"sgd", "adamw"}) {
      std::vector<at::Tensor> c = clones(cpu), g = clones(gpu);
      OptimizerSpec spec{.name = name, .lr = 1e-2, .momentum = 0.9, .weight_decay = 0.1};
      auto oc = make_optimizer(spec, {{c}});
      auto og = make_optimizer(spec, {{g}});
      for (int s = 0; s < 5; ++s) {
        for (size_t i = 0; i < c.size(); ++i) {
          c[i].mutable_grad() = at::randn(c[i].sizes()).to(dtype);
          g[i].mutable_grad() = c[i].grad().to(at::kCUDA);
        }
        oc->step();
        og->step();
      }
      for (size_t i = 0; i < c.size(); ++i) {
        EXPECT_EQ(og->state(0, i, "step").device().type(), at::kCUDA);
        if (dtype == at::kBFloat16) {
          EXPECT_LE(rel(og->state(0, i, "master").cpu(), oc->state(0, i, "master")), 1e-5) << name << " " << i;
        }
        EXPECT_LE(rel(g[i].detach().cpu(), c[i].detach()), dtype == at::kFloat ? 1e-5 : 1e-2) << name << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace torus::optim
