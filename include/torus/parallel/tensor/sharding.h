// torus/parallel/tensor/sharding.h — how parameters are laid out over the TP
// group, how their layout-independent initial values are made, and how the
// full TP=1 tensors are gathered back (tests, checkpoints, export).
//
// Every parameter of a TP layer has a ShardSpec. A parameter split over TP
// holds one contiguous, equal block of dimension `dim` of its padded global
// tensor; a global size not divisible by the TP size is padded at the end
// (only the vocabulary is: see pad_vocab). Layers report their specs through
// the ShardedModule interface; parameters of modules that do not are
// replicated with full gradients (the default for any torch::nn::Module).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "torus/comm/process_group.h"

namespace torch::nn {
class Module;
}

namespace torus::tp {

struct ShardSpec {
  int dim = -1;            // dimension split over TP; -1: replicated on every TP rank
  int64_t full_size = -1;  // global size along `dim` without padding; -1: no padding
  // Replicated parameter whose gradient on each TP rank is only a partial sum
  // (it acts on this rank's slice of a sequence-parallel region): the gradient
  // must be summed over TP before the step. The DP wrapper does this.
  bool tp_partial_grad = false;

  bool sharded() const { return dim >= 0; }
};

using ShardSpecs = std::map<std::string, ShardSpec>;  // by parameter name

// Implemented by modules whose parameters are not plain replicated ones.
class ShardedModule {
 public:
  virtual ~ShardedModule() = default;
  // Specs of this module's OWN parameters (not its children's), by local name.
  virtual ShardSpecs shard_specs() const = 0;
};

// Specs of every parameter of `module` and its descendants, by the names of
// module.named_parameters(); parameters not covered are replicated.
ShardSpecs collect_shard_specs(const torch::nn::Module& module);

// One rank's block [offset, offset + size) of a padded global dimension.
struct ShardRange {
  int64_t offset = 0;
  int64_t size = 0;
};
// `padded` must be divisible by `tp_size` (InvalidArgument otherwise).
ShardRange shard_range(int64_t padded, int tp_rank, int tp_size);

// The vocabulary size rounded up to a multiple of multiple * tp_size, so each
// TP rank holds an equal block (Megatron's make-vocab-size-divisible-by).
int64_t pad_vocab(int64_t vocab, int tp_size, int64_t multiple = 1);

// How to draw a parameter's full value.
struct InitSpec {
  enum class Kind { kNormal, kZeros, kOnes };
  Kind kind = Kind::kNormal;
  double std = 0.02;  // kNormal only
  uint64_t seed = 0;  // kNormal: seed of the CPU generator (derive_seed(model seed, name))
};

// This rank's shard of a parameter whose full (unpadded) shape is
// `full_shape` (Note [Layout-independent init] in random.h): draws the full
// tensor on the CPU in `dtype`, pads dimension spec.dim with zeros up to
// `padded` (ignored when spec is replicated), and returns the rank's block,
// contiguous, on `options.device()`.
at::Tensor init_shard(at::IntArrayRef full_shape, const ShardSpec& spec, int64_t padded, const InitSpec& init,
                      int tp_rank, int tp_size, const at::TensorOptions& options);

// While alive on this thread, init_shard and DeferredInit::materialize give
// normally distributed parameters zeros instead of drawing their
// layout-independent values (every rank draws every full tensor: the bulk of
// building a large model on CPUs). For a model every parameter of which is
// overwritten right after — torus-train --init-from, whose loader refuses a
// source that lacks any parameter before it changes anything. Nests.
class SkipInitDraws {
 public:
  SkipInitDraws();
  ~SkipInitDraws();
  SkipInitDraws(const SkipInitDraws&) = delete;
  SkipInitDraws& operator=(const SkipInitDraws&) = delete;

 private:
  bool previous_;
};

// Note [Deferred initialisation]: while a DeferredInit::Scope is alive on
// this thread, init_shard draws nothing: it returns a tensor of the shard's
// shape whose storage holds no bytes, and records how to draw it. A sharded
// model (ZeRO-3) is built so, then initialised one unit at a time
// (materialize() into the unit's buffer), so that no rank ever holds the
// whole model; the values are those init_shard would have returned
// (layout-independent init is kept). A tensor under deferral must not be
// read before it is materialised.
class DeferredInit {
 public:
  class Scope {
   public:
    explicit Scope(DeferredInit& init);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    DeferredInit* previous_;
  };
  // Was `param` created by init_shard under this recorder?
  bool deferred(const at::Tensor& param) const;
  // Draws param's values into `out` (same number of elements; any dtype and
  // device). InvalidArgument for a tensor not recorded here.
  void materialize(const at::Tensor& param, at::Tensor& out) const;
  // Gives `param` its values in storage of its own.
  void materialize(at::Tensor& param) const;

 private:
  friend at::Tensor init_shard(at::IntArrayRef, const ShardSpec&, int64_t, const InitSpec&, int, int,
                               const at::TensorOptions&);
  struct Recipe {
    std::vector<int64_t> full_shape;
    ShardSpec spec;
    int64_t padded = 0;
    InitSpec init;
    int tp_rank = 0, tp_size = 1;
    at::TensorOptions options;
  };
  std::unordered_map<const void*, Recipe> recipes_;
};

// The full, unpadded tensor of one parameter (or gradient): all-gathers the
// shards over `tp` along spec.dim and drops the padding; a replicated tensor
// is returned as is. Collective over `tp` for sharded specs.
at::Tensor gather_full(const at::Tensor& shard, const ShardSpec& spec, const comm::ProcessGroupPtr& tp);

// Full tensors of every parameter of `module`, by name, detached. Collective
// over `tp` (same order on every rank).
std::map<std::string, at::Tensor> gather_full_parameters(const torch::nn::Module& module,
                                                         const comm::ProcessGroupPtr& tp);

}  // namespace torus::tp
