// torus/optim/optimizer.h — the optimizer seam of the training engine.
//
//   std::vector<torus::optim::ParamGroup> groups = {{decay, 0.1}, {no_decay, 0.0}};
//   auto opt = torus::optim::make_optimizer({.name = "adamw", .lr = 3e-4, .beta2 = 0.95}, std::move(groups));
//   for (int step = 0; ...; ++step) {
//     loss.backward();
//     opt->set_lr(schedule(step));
//     if (clip_grad_norm(entries, 1.0, mp_group).finite) opt->step();   // a skipped step changes nothing
//     opt->zero_grad();
//   }
//
// An Optimizer owns parameter groups and the per-parameter state of one
// algorithm (SGD, Adam, AdamW: sgd.h, adam.h, adamw.h) and updates the
// parameters in place, exactly as torch.optim's algorithm of the same name
// (same formulas, same order of operations; each update is one of ATen's fused
// multi-tensor kernels, at::_fused_sgd_ / _fused_adam_ / _fused_adamw_, one call
// per group, dtype, device and first-step flag).
//
// The contract common to every optimizer:
//  * Groups. Each ParamGroup lists parameters (leaf tensors, each listed once
//    over all groups; no two may share memory) with optional overrides of the
//    optimizer's options. A group's learning rate is lr() x lr_scale, so one
//    set_lr() (what an LR schedule calls) moves every group. An override the
//    algorithm does not use (momentum on Adam, betas on SGD) is an error.
//  * Names. Every parameter has a global name, the prefix of its state_dict
//    keys: ParamGroup::names, or "g<group>.p<index>" when a group gives none.
//  * Steps. step() updates every parameter that has a gradient and counts one
//    optimizer step (step_count()) whether or not any parameter had one; each
//    parameter also counts its own updates (step_count(g, i)), which drive
//    Adam's bias correction and SGD's first-step momentum rule. Nothing
//    advances unless step() is called: a skipped step (non-finite gradient
//    norm, loss-scale overflow) leaves parameters, state and counts
//    bit-identical.
//  * Gradients. A parameter's gradient is param.grad(), or what the grad
//    provider returns for it (set_grad_provider); an undefined gradient skips
//    the parameter. Gradients must have the parameter's shape and device, and
//    its dtype unless the parameter has a master copy (then any floating dtype,
//    upcast to fp32). Gradients are read, never written.
//  * Master weights (Note [Master weights]).
//  * State is created on a parameter's first update (lazily), or for all at
//    once by init_state(), or by load_state_dict(): fp32 for a parameter with a
//    master copy, else in the parameter's dtype; always on the parameter's
//    device.
//  * Errors. Constructors, set_lr, step and load_state_dict check their input
//    and throw torus::InvalidArgument (Unsupported for sparse gradients)
//    before changing anything.
//  * Blocking and streams: step() enqueues kernels on the current stream of
//    the parameters' device and does not synchronise (nothing is read back).
//    The state accessors do not synchronise either; step_count(g, i) is a host
//    counter.
//  * Thread safety: none; one call at a time, like any optimizer.
//
// Note [Master weights]: a parameter that is f16 or bf16 (MasterWeights::kHalf,
// the default), or also f32 (kAlways), gets an fp32 master copy when its state
// is created. The update runs on the master with the gradient upcast to fp32
// and fp32 state, then writes the master rounded to the parameter's dtype
// back into the parameter (round to nearest even). After its first update the
// master, not the parameter, is the value the optimizer continues from: write
// new values into such a parameter through load_state_dict (the "master" key),
// not by assigning the parameter. f64 parameters never get one; kNever updates
// every parameter in its own dtype, like torch.optim on that dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torus::optim {

// One parameter group. The options of the optimizer apply unless a field
// here overrides them; aggregate initialisation keeps working:
//   ParamGroup{tensors, 0.1}        // weight decay 0.1
//   ParamGroup{.params = tensors, .weight_decay = 0.0, .lr_scale = 0.1, .names = {...}}
struct ParamGroup {
  // (Every member has an initialiser, so that {params, wd} raises no missing-initialiser warning.)
  std::vector<at::Tensor> params{};               // leaves; each at most once over all groups
  std::optional<double> weight_decay{};           // >= 0; default: the optimizer's
  double lr_scale = 1.0;                          // >= 0; this group's lr = the optimizer's lr x lr_scale
  std::optional<double> beta1{}, beta2{}, eps{};  // Adam, AdamW
  std::optional<double> momentum{}, dampening{};  // SGD
  std::optional<bool> nesterov{};                 // SGD
  std::vector<std::string> names{};  // global names of params (state_dict prefixes); empty: "g<group>.p<index>"
};

enum class MasterWeights : uint8_t {
  kHalf,    // f16 and bf16 parameters get an fp32 master copy (the default)
  kAlways,  // f16, bf16 and f32 parameters do (f64 never)
  kNever,   // every parameter is updated in its own dtype
};

// Options common to every optimizer (the algorithm's own are SGDOptions,
// AdamOptions, AdamWOptions).
struct OptimizerOptions {
  MasterWeights master_weights = MasterWeights::kHalf;
};

// Returns the gradient to use for `param` (one of the optimizer's parameter
// tensors), or an undefined tensor to skip it this step.
using GradProvider = std::function<at::Tensor(const at::Tensor& param)>;

// The key of the optimizer's step count in state_dict() (it has no '.', so it
// cannot collide with a "<name>.<state>" key).
inline constexpr std::string_view kStepCountKey = "step_count";

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "sgd", "adam", "adamw", "cpu_adam" or "cpu_adamw" (OptimizerSpec::name).
  const std::string& name() const { return name_; }

  // One update of every parameter that has a gradient, at each group's
  // current lr; counts one optimizer step. Throws before changing anything
  // when a gradient's shape, device or dtype does not fit its parameter.
  void step();
  // Convenience: set_lr(lr) when lr >= 0 (it stays set), then step().
  void step(double lr);
  // Zeroes every param.grad() in place (keeps their storage: the DP buckets
  // own it). Gradients from a grad provider belong to the provider.
  void zero_grad();

  // The base learning rate (>= 0, finite); group g uses lr() x lr_scale.
  void set_lr(double lr);
  double lr() const { return lr_; }
  double group_lr(size_t g) const;
  // Group g's resolved hyper-parameters for logging: "lr", "lr_scale",
  // "weight_decay" and the algorithm's own ("beta1", "momentum", "nesterov"
  // as 0/1...).
  std::map<std::string, double> hyperparameters(size_t g) const;

  // Optimizer steps taken (calls of step()), and updates of parameter i of
  // group g (fewer when it had no gradient at some steps).
  int64_t step_count() const { return step_count_; }
  int64_t step_count(size_t g, size_t i) const;

  // Supplies gradients instead of param.grad() (e.g. fp32 main-gradient
  // buffers of a gradient-sync component while the parameters are bf16).
  // Called once per parameter per step(), in group order. Null: param.grad().
  void set_grad_provider(GradProvider provider) { grad_provider_ = std::move(provider); }

  // Creates the state (zeros; masters copied from the parameters) of every
  // parameter that has none, so that memory is allocated up front. Counts
  // stay 0: the first update still behaves as a first update.
  void init_state();

  // The state by key: "<name>.<state>" for every parameter that has state
  // ("step": 0-dim f32 on the parameter's device, the kernels' convention;
  // "exp_avg", "exp_avg_sq" or "momentum_buffer"; "master" for a parameter
  // with a master copy) and kStepCountKey (0-dim int64 on the CPU). The
  // tensors alias the live state: clone them to keep a snapshot.
  std::map<std::string, at::Tensor> state_dict() const;
  // Replaces the whole state with copies of `state` (any device): every
  // parameter gets either all of its keys or none (then it has no state and
  // its next update is a first update). Each tensor must have the shape and
  // dtype state_dict() gives it; keys of no parameter are errors. All of it
  // is checked before anything changes (InvalidArgument naming the key).
  // A loaded master is also written, rounded, into its parameter.
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

  size_t num_groups() const { return groups_.size(); }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const std::string& param_name(size_t g, size_t i) const { return slot(g, i).name; }
  // Does parameter i of group g get an fp32 master copy (Note [Master weights])?
  bool has_master(size_t g, size_t i) const { return slot(g, i).use_master; }
  // State `state_name` ("step", "master", "exp_avg"...) of parameter i of
  // group g; undefined before the parameter has state.
  at::Tensor state(size_t g, size_t i, std::string_view state_name) const;
  // The names of group g's state tensors besides "step" and "master".
  virtual std::vector<std::string> buffer_names(size_t g) const = 0;

 protected:
  // The tensors of one fused kernel call: parameters of one group with the
  // same compute dtype and device and the same first-step flag.
  struct Batch {
    std::vector<at::Tensor> params;                // what is updated: the masters, or the parameters themselves
    std::vector<at::Tensor> grads;                 // each with its params' dtype
    std::vector<std::vector<at::Tensor>> buffers;  // buffers[k][j]: buffer_names()[k] of params[j]
    std::vector<at::Tensor> steps;                 // already advanced by one
    bool first_step = false;                       // every parameter's first update
    // Only when fuses_master_write_back(): outputs[j] is the parameter that
    // update() must write params[j] into, rounded to its dtype, when params[j]
    // is its master copy; else undefined.
    std::vector<at::Tensor> outputs;
  };

  // `who` names the algorithm in messages ("AdamW"); name() is its lower
  // case. Checks the groups (defined, distinct, non-overlapping parameters;
  // names; lr_scale and weight decay); the derived class checks its options.
  // `name` overrides the lower-case `who` as name() ("cpu_adamw").
  Optimizer(std::string_view who, std::vector<ParamGroup> groups, double lr, double default_weight_decay,
            OptimizerOptions options, std::string_view name = {});

  // One fused update of `batch`, a part of group g, at learning rate lr.
  virtual void update(size_t g, double lr, Batch& batch) = 0;
  // Adds group g's own hyper-parameters to `out` (hyperparameters()).
  virtual void add_hyperparameters(size_t g, std::map<std::string, double>& out) const = 0;
  // Optional capabilities of an algorithm (all off by default):
  //  * skip_step(): asked once per step() after the gradients are checked;
  //    true makes that step() a skipped step (nothing changes, no count
  //    advances), e.g. on a found_inf flag the algorithm holds.
  //  * reads_half_gradients(): gradients in f16 or bf16 of a parameter with
  //    an fp32 master reach update() as they are, not upcast to fp32.
  //  * fuses_master_write_back(): update() writes each master into its
  //    parameter itself (Batch::outputs), instead of the copy step() makes.
  virtual bool skip_step() const { return false; }
  virtual bool reads_half_gradients() const { return false; }
  virtual bool fuses_master_write_back() const { return false; }

  const std::string& who() const { return who_; }
  double weight_decay(size_t g) const { return groups_[g].weight_decay.value_or(default_weight_decay_); }

 private:
  struct Slot {
    std::string name;
    bool use_master = false;
    int64_t count = 0;                // host copy of `step`
    at::Tensor step;                  // undefined: no state yet
    at::Tensor master;                // fp32, when use_master
    std::vector<at::Tensor> buffers;  // buffer_names(g) order
  };
  const Slot& slot(size_t g, size_t i) const { return slots_.at(g).at(i); }
  at::Tensor gradient_of(const at::Tensor& param) const;
  void create_state(size_t g, size_t i);

  std::string who_, name_;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<Slot>> slots_;
  double lr_;
  double default_weight_decay_;
  OptimizerOptions options_;
  int64_t step_count_ = 0;
  GradProvider grad_provider_;
};

// An optimizer described by values, e.g. from a command line.
struct OptimizerSpec {
  std::string name = "adamw";  // "sgd" | "adam" | "adamw" | "cpu_adam" | "cpu_adamw" (cpu_adam.h)
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  double momentum = 0.0, dampening = 0.0;         // sgd
  bool nesterov = false;                          // sgd
  double weight_decay = 0.0;                      // the default of groups that do not set their own
  OptimizerOptions options;
  // Throws InvalidArgument for an unknown name or an option out of range for
  // that algorithm (what its constructor would reject).
  void validate() const;
};

// The optimizer `spec` names over `groups`. Throws as its constructor does.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<ParamGroup> groups);

}  // namespace torus::optim
