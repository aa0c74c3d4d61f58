// The reentrant recompute function (recompute.h, Note [Recompute replay]).
#include "torus/recompute/recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <utility>

#include "core/log.h"
#include "torus/parallel/backward_callback.h"
#include "torus/parallel/replay.h"
#include "torus/parallel/tensor/random.h"
#include "torus/parallel/tensor/weight_grad.h"

namespace torus::recompute {
namespace {

// ---- generators ---------------------------------------------------------------

// Every generator the replay restores, each with the state it had at the
// original forward.
struct GeneratorStates {
  std::vector<std::shared_ptr<tp::RngTracker>> trackers;
  std::vector<tp::RngTracker::State> tracker_states;
  std::vector<at::Generator> generators;  // CPU default, then the inputs' devices' defaults
  std::vector<at::Tensor> generator_states;

  static GeneratorStates capture(std::vector<std::shared_ptr<tp::RngTracker>> trackers,
                                 const std::vector<c10::Device>& devices) {
    GeneratorStates s;
    s.trackers = std::move(trackers);
    for (const auto& t : s.trackers) s.tracker_states.push_back(t->get_state());
    s.generators.push_back(at::detail::getDefaultCPUGenerator());
    for (const c10::Device& d : devices) s.generators.push_back(at::globalContext().defaultGenerator(d));
    for (auto& g : s.generators) {
      std::lock_guard<std::mutex> lock(g.mutex());
      s.generator_states.push_back(g.get_state());
    }
    return s;
  }

  // Sets every generator to the captured states.
  void apply() {
    for (size_t i = 0; i < trackers.size(); ++i) trackers[i]->set_state(tracker_states[i]);
    for (size_t i = 0; i < generators.size(); ++i) {
      std::lock_guard<std::mutex> lock(generators[i].mutex());
      generators[i].set_state(generator_states[i]);
    }
  }
};

// Sets the generators to the forward's states while alive; puts back the
// states they had before.
class GeneratorSwap {
 public:
  explicit GeneratorSwap(GeneratorStates& forward) {
    std::vector<c10::Device> devices;
    for (size_t i = 1; i < forward.generators.size(); ++i) devices.push_back(forward.generators[i].device());
    now_ = GeneratorStates::capture(forward.trackers, devices);
    forward.apply();
  }
  ~GeneratorSwap() { now_.apply(); }
  GeneratorSwap(const GeneratorSwap&) = delete;
  GeneratorSwap& operator=(const GeneratorSwap&) = delete;

 private:
  GeneratorStates now_;
};

// ---- thread-local modes --------------------------------------------------------

struct Modes {
  struct Autocast {
    c10::DeviceType device;
    bool enabled;
    at::ScalarType dtype;
  };
  std::vector<Autocast> autocast;  // CPU, then the inputs' device types
  bool autocast_cache = true;
  bool defer_weight_grad = false;

  static Modes capture(const std::vector<c10::Device>& devices) {
    Modes m;
    auto add = [&](c10::DeviceType t) {
      for (const auto& a : m.autocast) {
        if (a.device == t) return;
      }
      m.autocast.push_back({t, at::autocast::is_autocast_enabled(t), at::autocast::get_autocast_dtype(t)});
    };
    add(c10::DeviceType::CPU);
    for (const auto& d : devices) add(d.type());
    m.autocast_cache = at::autocast::is_autocast_cache_enabled();
    m.defer_weight_grad = tp::weight_grad_deferral_enabled();
    return m;
  }
};

// The original forward's modes while alive (grad mode on); the current ones
// afterwards. An enabled autocast is entered like torch.autocast: nesting
// counted, its cast cache cleared when the outermost one exits.
class ModesGuard {
 public:
  explicit ModesGuard(const Modes& forward)
      : grad_(true), defer_(forward.defer_weight_grad), saved_cache_(at::autocast::is_autocast_cache_enabled()) {
    for (const auto& a : forward.autocast) {
      saved_.push_back(
          {a.device, at::autocast::is_autocast_enabled(a.device), at::autocast::get_autocast_dtype(a.device)});
      at::autocast::set_autocast_enabled(a.device, a.enabled);
      at::autocast::set_autocast_dtype(a.device, a.dtype);
      entered_ |= a.enabled;
    }
    at::autocast::set_autocast_cache_enabled(forward.autocast_cache);
    if (entered_) at::autocast::increment_nesting();
  }
  ~ModesGuard() {
    if (entered_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    for (const auto& a : saved_) {
      at::autocast::set_autocast_enabled(a.device, a.enabled);
      at::autocast::set_autocast_dtype(a.device, a.dtype);
    }
    at::autocast::set_autocast_cache_enabled(saved_cache_);
  }
  ModesGuard(const ModesGuard&) = delete;
  ModesGuard& operator=(const ModesGuard&) = delete;

 private:
  at::AutoGradMode grad_;
  tp::DeferWeightGradGuard defer_;
  std::vector<Modes::Autocast> saved_;
  bool saved_cache_;
  bool entered_ = false;
};

// ---- the autograd function -----------------------------------------------------

// Everything the backward needs besides the saved inputs. Travels through
// the context's saved_data in an IValue capsule.
struct Replay : torch::CustomClassHolder {
  MultiFunction fn;
  GeneratorStates generators;
  Modes modes;
  std::vector<bool> requires_grad;  // per input
  bool dummy = false;               // the last input is the zero-size leaf (no input required grad)
};

struct Recompute : torch::autograd::Function<Recompute> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs, at::IValue replay) {
    auto* r = static_cast<Replay*>(replay.toCapsule().get());
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["replay"] = std::move(replay);
    std::vector<at::Tensor> args(inputs.begin(), inputs.end() - (r->dummy ? 1 : 0));
    return r->fn(args);  // no grad here (apply() turned it off): no graph, no saved activations
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* r = static_cast<Replay*>(ctx->saved_data["replay"].toCapsule().get());
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const size_t n = r->requires_grad.size();
    std::vector<at::Tensor> detached;
    detached.reserve(n);
    for (size_t i = 0; i < n; ++i) detached.push_back(saved[i].detach().requires_grad_(r->requires_grad[i]));
    at::Tensor out;
    {
      GeneratorSwap rng(r->generators);
      ModesGuard modes(r->modes);
      parallel::ReplayScope replay_scope;  // parallel::replaying() is true inside (replay.h)
      out = r->fn(detached);
    }
    if (out.requires_grad() && grads[0].defined()) {
      parallel::InnerBackwardScope inner;  // Note [Inner backward]
      torch::autograd::backward({out}, {grads[0]});
    }
    torch::autograd::variable_list result;
    result.reserve(saved.size() + 1);
    for (size_t i = 0; i < n; ++i) result.push_back(r->requires_grad[i] ? detached[i].grad() : at::Tensor());
    if (r->dummy) result.emplace_back();
    result.emplace_back();  // the capsule
    return result;
  }
};

}  // namespace

at::Tensor run(MultiFunction fn, std::vector<at::Tensor> inputs, RecomputeState captures) {
  TORUS_CHECK(fn != nullptr, InvalidArgument, "recompute::run: empty function");
  TORUS_CHECK(!inputs.empty(), InvalidArgument, "recompute::run: no inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORUS_CHECK(inputs[i].defined(), InvalidArgument, "recompute::run: input {} is undefined", i);
  }
  for (const auto& t : captures.rng_trackers) {
    TORUS_CHECK(t != nullptr, InvalidArgument, "recompute::run: null RngTracker");
  }
  if (!at::GradMode::is_enabled()) return fn(inputs);

  std::vector<c10::Device> devices;
  for (const auto& x : inputs) {
    if (x.device().is_cpu()) continue;
    bool seen = false;
    for (const auto& d : devices) seen |= d == x.device();
    if (!seen) devices.push_back(x.device());
  }
  auto replay = c10::make_intrusive<Replay>();
  replay->fn = std::move(fn);
  replay->generators = GeneratorStates::capture(std::move(captures.rng_trackers), devices);
  replay->modes = Modes::capture(devices);
  bool any = false;
  for (const auto& x : inputs) {
    replay->requires_grad.push_back(x.requires_grad());
    any |= x.requires_grad();
  }
  if (!any) {
    replay->dummy = true;
    inputs.push_back(at::empty({0}, inputs[0].options().dtype(at::kFloat)).requires_grad_(true));
  }
  return Recompute::apply(at::TensorList(inputs), at::IValue::make_capsule(std::move(replay)));
}

at::Tensor run(Function fn, const at::Tensor& input, RecomputeState captures) {
  TORUS_CHECK(fn != nullptr, InvalidArgument, "recompute::run: empty function");
  return run([f = std::move(fn)](const std::vector<at::Tensor>& in) { return f(in[0]); },
             std::vector<at::Tensor>{input}, std::move(captures));
}

}  // namespace torus::recompute
