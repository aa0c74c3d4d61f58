// Shard specs, layout-independent initial values and gathering of full
// tensors (sharding.h).
#include "torus/parallel/tensor/sharding.h"

#include <ATen/Functions.h>
#include <c10/core/StorageImpl.h>
#include <torch/nn/module.h>

#include "core/log.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/mappings.h"
#include "torus/parallel/tensor/random.h"

namespace torus::tp {
namespace {

void collect(const torch::nn::Module& module, const std::string& prefix, ShardSpecs& out) {
  if (const auto* sharded = dynamic_cast<const ShardedModule*>(&module)) {
    for (const auto& [name, spec] : sharded->shard_specs()) out[prefix + name] = spec;
  }
  for (const auto& child : module.named_children()) collect(*child.value(), prefix + child.key() + ".", out);
}

}  // namespace

ShardSpecs collect_shard_specs(const torch::nn::Module& module) {
  ShardSpecs specs;
  collect(module, "", specs);
  return specs;
}

ShardRange shard_range(int64_t padded, int tp_rank, int tp_size) {
  TORUS_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, InvalidArgument, "shard_range: rank {} of {}", tp_rank,
              tp_size);
  TORUS_CHECK(padded % tp_size == 0, InvalidArgument, "size {} is not divisible by the tensor-parallel size {}", padded,
              tp_size);
  const int64_t size = padded / tp_size;
  return {tp_rank * size, size};
}

int64_t pad_vocab(int64_t vocab, int tp_size, int64_t multiple) {
  TORUS_CHECK(vocab >= 1 && tp_size >= 1 && multiple >= 1, InvalidArgument,
              "pad_vocab: vocab {}, tp size {} and multiple {} must be >= 1", vocab, tp_size, multiple);
  const int64_t m = multiple * tp_size;
  return (vocab + m - 1) / m * m;
}

namespace {

thread_local DeferredInit* t_recorder = nullptr;
thread_local bool t_skip_draws = false;

at::Tensor draw_shard(at::IntArrayRef full_shape, const ShardSpec& spec, int64_t padded, const InitSpec& init,
                      int tp_rank, int tp_size, const at::TensorOptions& options);

}  // namespace

SkipInitDraws::SkipInitDraws() : previous_(t_skip_draws) { t_skip_draws = true; }
SkipInitDraws::~SkipInitDraws() { t_skip_draws = previous_; }

DeferredInit::Scope::Scope(DeferredInit& init) : previous_(t_recorder) { t_recorder = &init; }
DeferredInit::Scope::~Scope() { t_recorder = previous_; }

bool DeferredInit::deferred(const at::Tensor& param) const {
  return param.defined() && recipes_.count(param.unsafeGetTensorImpl()) > 0;
}

void DeferredInit::materialize(const at::Tensor& param, at::Tensor& out) const {
  auto it = recipes_.find(param.unsafeGetTensorImpl());
  TORUS_CHECK(it != recipes_.end(), InvalidArgument, "DeferredInit: the tensor was not created while recording");
  const Recipe& r = it->second;
  at::Tensor drawn = draw_shard(r.full_shape, r.spec, r.padded, r.init, r.tp_rank, r.tp_size, r.options);
  TORUS_CHECK(drawn.numel() == out.numel(), InvalidArgument, "DeferredInit: {} elements into a tensor of {}",
              drawn.numel(), out.numel());
  at::NoGradGuard no_grad;
  out.copy_(drawn.view(out.sizes()));
}

void DeferredInit::materialize(at::Tensor& param) const {
  at::Tensor values = at::empty(param.sizes(), param.options().requires_grad(false));
  materialize(param, values);
  at::NoGradGuard no_grad;
  param.set_data(values);
}

at::Tensor init_shard(at::IntArrayRef full_shape, const ShardSpec& spec, int64_t padded, const InitSpec& init,
                      int tp_rank, int tp_size, const at::TensorOptions& options) {
  if (t_recorder == nullptr) return draw_shard(full_shape, spec, padded, init, tp_rank, tp_size, options);
  // Note [Deferred initialisation]: the shard's shape, with storage released.
  std::vector<int64_t> shape(full_shape.begin(), full_shape.end());
  if (spec.sharded()) {
    TORUS_CHECK(spec.dim < static_cast<int>(shape.size()), InvalidArgument, "init_shard: shard dim {} of a {}-d tensor",
                spec.dim, shape.size());
    shape[spec.dim] = shard_range(padded, tp_rank, tp_size).size;
  }
  at::Tensor t = at::empty(shape, options);
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  st->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  st->set_nbytes(0);
  t_recorder->recipes_[t.unsafeGetTensorImpl()] =
      DeferredInit::Recipe{std::vector<int64_t>(full_shape.begin(), full_shape.end()), spec, padded, init, tp_rank,
                           tp_size, options};
  return t;
}

namespace {

at::Tensor draw_shard(at::IntArrayRef full_shape, const ShardSpec& spec, int64_t padded, const InitSpec& init,
                      int tp_rank, int tp_size, const at::TensorOptions& options) {
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  if (t_skip_draws && init.kind == InitSpec::Kind::kNormal) {  // SkipInitDraws: overwritten right after
    std::vector<int64_t> shape(full_shape.begin(), full_shape.end());
    if (spec.sharded()) {
      TORUS_CHECK(spec.dim < static_cast<int>(shape.size()), InvalidArgument,
                  "init_shard: shard dim {} of a {}-d tensor", spec.dim, shape.size());
      shape[spec.dim] = shard_range(padded, tp_rank, tp_size).size;
    }
    return at::zeros(shape, options.dtype(dtype));
  }
  // Drawn on the CPU in f32 (f64 for f64 models), whatever the target type:
  // the same numbers on every rank and device.
  auto cpu = at::TensorOptions().dtype(dtype == at::kDouble ? at::kDouble : at::kFloat);
  at::Tensor full;
  switch (init.kind) {
    case InitSpec::Kind::kZeros:
      full = at::zeros(full_shape, cpu);
      break;
    case InitSpec::Kind::kOnes:
      full = at::ones(full_shape, cpu);
      break;
    case InitSpec::Kind::kNormal: {
      at::Generator gen = make_generator(init.seed);
      full = at::empty(full_shape, cpu).normal_(0.0, init.std, gen);
      break;
    }
  }
  if (spec.sharded()) {
    TORUS_CHECK(spec.dim < full.dim(), InvalidArgument, "init_shard: shard dim {} of a {}-d tensor", spec.dim,
                full.dim());
    const int64_t size = full.size(spec.dim);
    TORUS_CHECK(padded >= size, InvalidArgument, "init_shard: padded size {} < size {}", padded, size);
    if (padded > size) {
      // constant_pad_nd pads the last dimensions first: {..., dim's before, dim's after}.
      std::vector<int64_t> pad(2 * (full.dim() - spec.dim), 0);
      pad[pad.size() - 1] = padded - size;
      full = at::constant_pad_nd(full, pad);
    }
    ShardRange r = shard_range(padded, tp_rank, tp_size);
    full = full.narrow(spec.dim, r.offset, r.size);
  }
  return full.to(options.device(), dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

}  // namespace

at::Tensor gather_full(const at::Tensor& shard, const ShardSpec& spec, const comm::ProcessGroupPtr& tp) {
  if (!spec.sharded()) return shard.detach();
  at::Tensor full = all_gather_along(shard.detach(), spec.dim, tp);
  if (spec.full_size >= 0 && spec.full_size < full.size(spec.dim)) full = full.narrow(spec.dim, 0, spec.full_size);
  return full;
}

std::map<std::string, at::Tensor> gather_full_parameters(const torch::nn::Module& module,
                                                         const comm::ProcessGroupPtr& tp) {
  const ShardSpecs specs = collect_shard_specs(module);
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_parameters()) {
    auto it = specs.find(item.key());
    out[item.key()] = gather_full(item.value(), it == specs.end() ? ShardSpec{} : it->second, tp);
  }
  return out;
}

}  // namespace torus::tp
