#include "torus/optim/optimizer.h"

#include <ATen/Functions.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <set>
#include <tuple>

#include "core/log.h"
#include "torus/comm/process_group.h"

namespace torus::optim {
namespace {

std::string shape_string(at::IntArrayRef sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}
std::string dtype_string(at::ScalarType t) {
  return comm::scalar_type_name(t);
}

bool wants_master(at::ScalarType t, MasterWeights mode) {
  switch (mode) {
    case MasterWeights::kHalf:
      return t == at::kHalf || t == at::kBFloat16;
    case MasterWeights::kAlways:
      return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat;
    case MasterWeights::kNever:
      return false;
  }
  return false;
}

// The bytes [begin, end) a tensor's elements span (non-negative strides).
struct Extent {
  uintptr_t begin = 0, end = 0;
  size_t g = 0, i = 0;
};

Extent extent_of(const at::Tensor& t, size_t g, size_t i) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * std::abs(t.stride(d));
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {begin, begin + static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(t.element_size())), g, i};
}

bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.storage().is_alias_of(b.storage()) && a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides();
}

}  // namespace

Optimizer::Optimizer(std::string_view who, std::vector<ParamGroup> groups, double lr, double default_weight_decay,
                     OptimizerOptions options, std::string_view name)
    : who_(who),
      name_(name),
      groups_(std::move(groups)),
      lr_(lr),
      default_weight_decay_(default_weight_decay),
      options_(options) {
  if (name_.empty()) {
    std::transform(who_.begin(), who_.end(), std::back_inserter(name_), [](char c) { return std::tolower(c); });
  }
  set_lr(lr);
  std::set<std::string> names;
  std::set<const void*> impls;
  std::vector<Extent> extents;
  slots_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& pg = groups_[g];
    TORUS_CHECK(std::isfinite(pg.lr_scale) && pg.lr_scale >= 0, InvalidArgument,
                "{}: group {} has lr_scale {} (must be >= 0)", who_, g, pg.lr_scale);
    TORUS_CHECK(!pg.weight_decay || (std::isfinite(*pg.weight_decay) && *pg.weight_decay >= 0), InvalidArgument,
                "{}: group {} has weight decay {} (must be >= 0)", who_, g, pg.weight_decay.value_or(0));
    TORUS_CHECK(pg.names.empty() || pg.names.size() == pg.params.size(), InvalidArgument,
                "{}: group {} names {} parameters but has {}", who_, g, pg.names.size(), pg.params.size());
    slots_[g].resize(pg.params.size());
    for (size_t i = 0; i < pg.params.size(); ++i) {
      const at::Tensor& p = pg.params[i];
      Slot& s = slots_[g][i];
      s.name = pg.names.empty() ? fmt::format("g{}.p{}", g, i) : pg.names[i];
      TORUS_CHECK(p.defined(), InvalidArgument, "{}: parameter {} of group {} ('{}') is undefined", who_, i, g, s.name);
      TORUS_CHECK(!s.name.empty() && s.name.find('\0') == std::string::npos, InvalidArgument,
                  "{}: parameter {} of group {} has an empty name", who_, i, g);
      TORUS_CHECK(names.insert(s.name).second, InvalidArgument, "{}: two parameters are named '{}'", who_, s.name);
      TORUS_CHECK(!p.is_sparse() && p.layout() == at::kStrided, InvalidArgument,
                  "{}: parameter '{}' is not a dense (strided) tensor", who_, s.name);
      TORUS_CHECK(at::isFloatingType(p.scalar_type()), InvalidArgument,
                  "{}: parameter '{}' is {} (optimizers update floating-point tensors)", who_, s.name,
                  dtype_string(p.scalar_type()));
      TORUS_CHECK(impls.insert(p.unsafeGetTensorImpl()).second, InvalidArgument,
                  "{}: parameter {} of group {} ('{}') is listed twice", who_, i, g, s.name);
      s.use_master = wants_master(p.scalar_type(), options_.master_weights);
      if (p.numel() > 0) extents.push_back(extent_of(p, g, i));
    }
  }
  // No two parameters may share memory (one update would clobber the other):
  // sort by start address and compare each extent with the furthest-reaching
  // one before it.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  const Extent* reach = nullptr;
  for (const Extent& e : extents) {
    if (reach && e.begin < reach->end) {
      const at::Tensor& a = groups_[reach->g].params[reach->i];
      const at::Tensor& b = groups_[e.g].params[e.i];
      if (at::get_overlap_status(a, b) != at::MemOverlapStatus::No) {
        TORUS_CHECK(!same_view(a, b), InvalidArgument, "{}: parameter '{}' is listed twice (also as '{}')", who_,
                    slot(e.g, e.i).name, slot(reach->g, reach->i).name);
        throw InvalidArgument(fmt::format("{}: parameters '{}' and '{}' share memory", who_,
                                          slot(reach->g, reach->i).name, slot(e.g, e.i).name));
      }
    }
    if (!reach || e.end > reach->end) reach = &e;
  }
}

Optimizer::~Optimizer() = default;

void Optimizer::set_lr(double lr) {
  TORUS_CHECK(std::isfinite(lr) && lr >= 0, InvalidArgument, "{}: lr must be >= 0 and finite, got {}", who_, lr);
  lr_ = lr;
}

double Optimizer::group_lr(size_t g) const {
  return lr_ * groups_.at(g).lr_scale;
}

std::map<std::string, double> Optimizer::hyperparameters(size_t g) const {
  std::map<std::string, double> out{
      {"lr", group_lr(g)}, {"lr_scale", groups_.at(g).lr_scale}, {"weight_decay", weight_decay(g)}};
  add_hyperparameters(g, out);
  return out;
}

int64_t Optimizer::step_count(size_t g, size_t i) const {
  return slot(g, i).count;
}

at::Tensor Optimizer::gradient_of(const at::Tensor& param) const {
  return grad_provider_ ? grad_provider_(param) : param.grad();
}

void Optimizer::create_state(size_t g, size_t i) {
  Slot& s = slots_[g][i];
  const at::Tensor& p = groups_[g].params[i];
  s.count = 0;
  s.step = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(p.device()));
  if (s.use_master) s.master = p.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  const at::Tensor& like = s.use_master ? s.master : p;
  s.buffers.clear();
  for (size_t k = 0, n = buffer_names(g).size(); k < n; ++k) {
    s.buffers.push_back(at::zeros_like(like, at::MemoryFormat::Preserve));
  }
}

void Optimizer::init_state() {
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      if (!slots_[g][i].step.defined()) create_state(g, i);
    }
  }
}

void Optimizer::step(double lr) {
  if (lr >= 0) set_lr(lr);
  step();
}

void Optimizer::step() {
  at::NoGradGuard no_grad;
  // 1. Every gradient, checked before anything changes.
  std::vector<std::vector<at::Tensor>> grads(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    grads[g].resize(groups_[g].params.size());
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const at::Tensor& p = groups_[g].params[i];
      const Slot& s = slots_[g][i];
      at::Tensor grad = gradient_of(p);
      if (!grad.defined()) continue;
      TORUS_CHECK(!grad.is_sparse() && grad.layout() == at::kStrided, Unsupported,
                  "{}: the gradient of '{}' is sparse (not supported)", who_, s.name);
      TORUS_CHECK(grad.sizes() == p.sizes(), InvalidArgument, "{}: the gradient of '{}' has shape {}, the parameter {}",
                  who_, s.name, shape_string(grad.sizes()), shape_string(p.sizes()));
      TORUS_CHECK(grad.device() == p.device(), InvalidArgument,
                  "{}: the gradient of '{}' is on {}, the parameter on {}", who_, s.name, grad.device().str(),
                  p.device().str());
      TORUS_CHECK(s.use_master ? at::isFloatingType(grad.scalar_type()) : grad.scalar_type() == p.scalar_type(),
                  InvalidArgument, "{}: the gradient of '{}' is {}, the parameter {}{}", who_, s.name,
                  dtype_string(grad.scalar_type()), dtype_string(p.scalar_type()),
                  s.use_master ? " (with an fp32 master: any floating dtype)" : "");
      grads[g][i] = std::move(grad);
    }
  }
  if (skip_step()) return;
  // 2. The update: one fused call per (dtype, device, first step) of each group.
  ++step_count_;
  const bool keep_half_grads = reads_half_gradients(), fused_write_back = fuses_master_write_back();
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back;  // (parameter, master)
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::map<std::tuple<int, int, int, bool>, Batch> batches;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      at::Tensor& grad = grads[g][i];
      if (!grad.defined()) continue;
      const at::Tensor& p = groups_[g].params[i];
      Slot& s = slots_[g][i];
      if (!s.step.defined()) create_state(g, i);
      const at::Tensor& target = s.use_master ? s.master : p;
      const bool half_grad = grad.scalar_type() == at::kHalf || grad.scalar_type() == at::kBFloat16;
      if (grad.scalar_type() != target.scalar_type() && !(keep_half_grads && s.use_master && half_grad)) {
        grad = grad.to(target.scalar_type());
      }
      const bool first = s.count == 0;
      ++s.count;
      const auto key = std::make_tuple(static_cast<int>(target.scalar_type()), static_cast<int>(p.device().type()),
                                       static_cast<int>(p.device().index()), first);
      Batch& b = batches[key];
      b.first_step = first;
      b.params.push_back(target);
      b.grads.push_back(grad);
      b.steps.push_back(s.step);
      b.buffers.resize(s.buffers.size());
      for (size_t k = 0; k < s.buffers.size(); ++k) b.buffers[k].push_back(s.buffers[k]);
      if (fused_write_back) {
        b.outputs.push_back(s.use_master ? p : at::Tensor());
      } else if (s.use_master) {
        write_back.emplace_back(p, s.master);
      }
    }
    for (auto& [key, b] : batches) {
      at::_foreach_add_(b.steps, 1);
      update(g, group_lr(g), b);
    }
  }
  for (auto& [p, master] : write_back) p.copy_(master);
}

void Optimizer::zero_grad() {
  for (auto& group : groups_) {
    for (auto& p : group.params) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }
}

at::Tensor Optimizer::state(size_t g, size_t i, std::string_view state_name) const {
  const Slot& s = slot(g, i);
  if (state_name == "step") return s.step;
  if (state_name == "master") return s.master;
  const std::vector<std::string> buffers = buffer_names(g);
  for (size_t k = 0; k < buffers.size(); ++k) {
    if (buffers[k] == state_name) return s.step.defined() ? s.buffers[k] : at::Tensor();
  }
  throw InvalidArgument(fmt::format("{}: no state '{}' (it has step, {}{})", who_, state_name,
                                    buffers.empty() ? "" : fmt::format("{}, ", fmt::join(buffers, ", ")), "master"));
}

std::map<std::string, at::Tensor> Optimizer::state_dict() const {
  std::map<std::string, at::Tensor> out;
  out.emplace(kStepCountKey, at::scalar_tensor(step_count_, at::TensorOptions().dtype(at::kLong)));
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<std::string> buffers = buffer_names(g);
    for (const Slot& s : slots_[g]) {
      if (!s.step.defined()) continue;
      out.emplace(s.name + ".step", s.step);
      if (s.use_master) out.emplace(s.name + ".master", s.master);
      for (size_t k = 0; k < buffers.size(); ++k) out.emplace(s.name + "." + buffers[k], s.buffers[k]);
    }
  }
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  const std::string who = who_ + "::load_state_dict";
  std::set<std::string> used;
  auto find = [&](const std::string& key) -> const at::Tensor* {
    auto it = state.find(key);
    if (it == state.end()) return nullptr;
    TORUS_CHECK(it->second.defined(), InvalidArgument, "{}: '{}' is an undefined tensor", who, key);
    used.insert(key);
    return &it->second;
  };
  auto check_like = [&](const std::string& key, const at::Tensor& t, at::IntArrayRef sizes, at::ScalarType dtype) {
    TORUS_CHECK(t.sizes() == sizes, InvalidArgument, "{}: '{}' has shape {}, expected {} (its parameter's)", who, key,
                shape_string(t.sizes()), shape_string(sizes));
    TORUS_CHECK(t.scalar_type() == dtype, InvalidArgument, "{}: '{}' is {}, expected {}", who, key,
                dtype_string(t.scalar_type()), dtype_string(dtype));
  };

  // 1. Check everything.
  const std::string count_key(kStepCountKey);
  const at::Tensor* count = find(count_key);
  TORUS_CHECK(count, InvalidArgument, "{}: no '{}' (the optimizer's step count)", who, count_key);
  check_like(count_key, *count, {}, at::kLong);
  const int64_t steps = count->item<int64_t>();
  TORUS_CHECK(steps >= 0, InvalidArgument, "{}: '{}' is {} (must be >= 0)", who, count_key, steps);
  struct Loaded {
    const at::Tensor* step = nullptr;  // null: no state for this parameter
    int64_t count = 0;
    const at::Tensor* master = nullptr;
    std::vector<const at::Tensor*> buffers;
  };
  std::vector<std::vector<Loaded>> loaded(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<std::string> buffers = buffer_names(g);
    loaded[g].resize(groups_[g].params.size());
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Slot& s = slots_[g][i];
      const at::Tensor& p = groups_[g].params[i];
      Loaded& l = loaded[g][i];
      l.step = find(s.name + ".step");
      std::vector<std::string> others;
      for (const auto& b : buffers) others.push_back(s.name + "." + b);
      if (!l.step) {
        for (const auto& key : others) {
          TORUS_CHECK(!state.count(key), InvalidArgument,
                      "{}: '{}' is given without '{}.step' (a parameter's state is loaded whole)", who, key, s.name);
        }
        TORUS_CHECK(!state.count(s.name + ".master"), InvalidArgument,
                    "{}: '{}.master' is given without '{}.step' (a parameter's state is loaded whole)", who, s.name,
                    s.name);
        continue;
      }
      check_like(s.name + ".step", *l.step, {}, at::kFloat);
      const double t = l.step->item<double>();
      TORUS_CHECK(t >= 0 && t == std::floor(t) && t < 16777216.0, InvalidArgument,
                  "{}: '{}.step' is {} (a whole number of updates, >= 0, below 2^24)", who, s.name, t);
      l.count = static_cast<int64_t>(t);
      const at::ScalarType compute = s.use_master ? at::kFloat : p.scalar_type();
      if (s.use_master) {
        l.master = find(s.name + ".master");
        TORUS_CHECK(l.master, InvalidArgument, "{}: no '{}.master' (the parameter is {} with an fp32 master copy)", who,
                    s.name, dtype_string(p.scalar_type()));
        check_like(s.name + ".master", *l.master, p.sizes(), at::kFloat);
      } else {
        TORUS_CHECK(!state.count(s.name + ".master"), InvalidArgument,
                    "{}: '{}.master' is given, but the parameter ({}) has no master copy under these options", who,
                    s.name, dtype_string(p.scalar_type()));
      }
      for (const auto& key : others) {
        const at::Tensor* b = find(key);
        TORUS_CHECK(b, InvalidArgument, "{}: no '{}' (every parameter with a '.step' needs it)", who, key);
        check_like(key, *b, p.sizes(), compute);
        l.buffers.push_back(b);
      }
    }
  }
  if (used.size() != state.size()) {
    std::vector<std::string> unknown;
    for (const auto& [key, t] : state) {
      if (!used.count(key) && unknown.size() < 5) unknown.push_back("'" + key + "'");
    }
    throw InvalidArgument(
        fmt::format("{}: {} key(s) of no parameter of this optimizer, e.g. {} (its parameters are "
                    "named like '{}')",
                    who, state.size() - used.size(), fmt::join(unknown, ", "),
                    groups_.empty() || slots_[0].empty() ? std::string("-") : slots_[0][0].name));
  }

  // 2. Replace the state (reusing existing tensors).
  at::NoGradGuard no_grad;
  step_count_ = steps;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      Slot& s = slots_[g][i];
      const Loaded& l = loaded[g][i];
      if (!l.step) {
        s.count = 0;
        s.step = at::Tensor();
        s.master = at::Tensor();
        s.buffers.clear();
        continue;
      }
      if (!s.step.defined()) create_state(g, i);
      s.count = l.count;
      s.step.copy_(*l.step);
      for (size_t k = 0; k < l.buffers.size(); ++k) s.buffers[k].copy_(*l.buffers[k]);
      if (s.use_master) {
        s.master.copy_(*l.master);
        groups_[g].params[i].copy_(s.master);
      }
    }
  }
}

}  // namespace torus::optim
