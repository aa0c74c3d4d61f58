// HostOffloadAdam (torus/optim/host_offload_adam.h): reduce-scatter on the
// device, the norm and Adam on the host, all-gather on the device; its state
// as flat host buffers (saved by the checkpoint layer).
#include "torus/optim/host_offload_adam.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/log.h"
#include "kernels/cpu/reduce.h"
#include "torus/comm/agree.h"
#include "torus/comm/backend.h"
#include "torus/device/device.h"
#include "torus/optim/cpu_adam_kernel.h"

namespace torus::optim {
namespace {

cpu::Dtype kernel_dtype(DType t) {
  switch (t) {
    case DType::kF32: return cpu::Dtype::kF32;
    case DType::kBF16: return cpu::Dtype::kBF16;
    case DType::kF16: return cpu::Dtype::kF16;
    default: break;
  }
  throw InvalidArgument(fmt::format("HostOffloadAdam: parameters of dtype {} (f32, bf16 or f16)", dtype_name(t)));
}

// The global names of the state (optim/flat_state.h).
constexpr const char* kMaster = "optim.master";
constexpr const char* kExpAvg = "optim.exp_avg";
constexpr const char* kExpAvgSq = "optim.exp_avg_sq";
constexpr const char* kStepCount = "optim.step_count";
constexpr const char* kOptimizer = "HostOffloadAdam";

}  // namespace

size_t HostOffloadAdam::padded_numel(size_t numel, int dp_size) {
  TORUS_CHECK(dp_size >= 1, InvalidArgument, "HostOffloadAdam: dp size {} must be >= 1", dp_size);
  size_t d = static_cast<size_t>(dp_size);
  return (numel + d - 1) / d * d;
}

HostOffloadAdam::HostOffloadAdam(comm::Backend& dp, void* params, void* grads, size_t numel, DType dtype,
                                 HostOffloadAdamOptions options)
    : dp_(dp), params_(params), grads_(grads), numel_(numel), dtype_(dtype), options_(std::move(options)) {
  kernel_dtype(dtype);
  const size_t d = static_cast<size_t>(dp.size());
  TORUS_CHECK(numel > 0 && numel % d == 0, InvalidArgument,
              "HostOffloadAdam: {} elements do not split evenly over {} data-parallel ranks; pad the buffers to "
              "padded_numel() = {}",
              numel, d, padded_numel(numel, dp.size()));
  TORUS_CHECK(params != nullptr && grads != nullptr && params != grads, InvalidArgument,
              "HostOffloadAdam: params and grads must be two distinct non-null buffers");
  TORUS_CHECK(dp.supports(comm::OpType::kReduceScatter, dtype, comm::ReduceOp::kSum) &&
                  dp.supports(comm::OpType::kAllGather, dtype) &&
                  dp.supports(comm::OpType::kAllReduce, DType::kF32, comm::ReduceOp::kSum) &&
                  dp.supports(comm::OpType::kAllReduce, DType::kI32, comm::ReduceOp::kMax),
              Unsupported,
              "HostOffloadAdam: the '{}' backend of group '{}' cannot reduce-scatter and all-gather {} and "
              "all-reduce an f32 sum and an i32 max",
              dp.name(), dp.group().name, dtype_name(dtype));
  TORUS_CHECK(options_.max_grad_norm >= 0 && std::isfinite(options_.max_grad_norm), InvalidArgument,
              "HostOffloadAdam: max_grad_norm {} must be finite and >= 0", options_.max_grad_norm);
  shard_ = numel / d;
  offset_ = shard_ * static_cast<size_t>(dp.rank());

  // The shard cut at group boundaries.
  std::vector<HostOffloadAdamGroup> groups = options_.groups;
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < groups.size(); ++i) {
    const HostOffloadAdamGroup& g = groups[i];
    TORUS_CHECK(g.numel > 0 && g.offset <= numel && g.numel <= numel - g.offset, InvalidArgument,
                "HostOffloadAdam: group [{}, +{}) is empty or outside the {} elements", g.offset, g.numel, numel);
    TORUS_CHECK(i == 0 || groups[i - 1].offset + groups[i - 1].numel <= g.offset, InvalidArgument,
                "HostOffloadAdam: groups [{}, +{}) and [{}, +{}) overlap", groups[i - 1].offset,
                groups[i - 1].numel, g.offset, g.numel);
    TORUS_CHECK(g.weight_decay >= 0 && g.lr_scale >= 0, InvalidArgument,
                "HostOffloadAdam: group [{}, +{}) has a negative weight decay or lr scale", g.offset, g.numel);
  }
  size_t at = offset_;
  const size_t stop = offset_ + shard_;
  auto add = [&](size_t b, size_t e, double wd, double lr_scale) {
    if (e > b) segments_.push_back({b - offset_, e - offset_, wd, lr_scale});
  };
  for (const HostOffloadAdamGroup& g : groups) {
    const size_t gb = std::max(g.offset, offset_), ge = std::min(g.offset + g.numel, stop);
    if (gb >= ge) continue;
    add(at, gb, options_.adam.weight_decay, 1.0);
    add(gb, ge, g.weight_decay, g.lr_scale);
    at = ge;
  }
  add(at, stop, options_.adam.weight_decay, 1.0);

  const size_t elt = dtype_size(dtype);
  device::Device& dev = device::get_device(dp.device_type());
  dev_grad_shard_ = dev.allocate(shard_ * elt);
  try {
    dev_param_shard_ = dev.allocate(shard_ * elt);
    dev_scalar_ = dev.allocate(sizeof(float));
  } catch (...) {
    dev.deallocate(dev_grad_shard_);
    dev.deallocate(dev_param_shard_);
    throw;
  }
  try {
    master_.resize(shard_);
    exp_avg_.assign(shard_, 0.0f);
    exp_avg_sq_.assign(shard_, 0.0f);
    const char* shard_start = static_cast<const char*>(params) + offset_ * elt;
    if (dtype == DType::kF32) {
      host_grad32_.resize(shard_);
      host_param32_.resize(shard_);
      dev.copy(master_.data(), shard_start, shard_ * elt);
    } else {
      host_grad16_.resize(shard_);
      host_param16_.resize(shard_);
      dev.copy(host_param16_.data(), shard_start, shard_ * elt);
      kernels::half_to_f32(host_param16_.data(), master_.data(), shard_, dtype);
    }
  } catch (...) {
    dev.deallocate(dev_grad_shard_);
    dev.deallocate(dev_param_shard_);
    dev.deallocate(dev_scalar_);
    throw;
  }
}

HostOffloadAdam::~HostOffloadAdam() {
  device::Device& dev = device::get_device(dp_.device_type());
  dev.deallocate(dev_grad_shard_);
  dev.deallocate(dev_param_shard_);
  dev.deallocate(dev_scalar_);
}

double HostOffloadAdam::grad_sum_squares(const void* host_grad) const {
  double sum = 0;
  if (dtype_ == DType::kF32) {
    const float* g = static_cast<const float*>(host_grad);
    for (size_t i = 0; i < shard_; ++i) sum += static_cast<double>(g[i]) * g[i];
    return sum;
  }
  constexpr size_t kChunk = 1 << 14;
  float buf[kChunk];
  const uint16_t* g = static_cast<const uint16_t*>(host_grad);
  for (size_t i = 0; i < shard_; i += kChunk) {
    const size_t n = std::min(kChunk, shard_ - i);
    kernels::half_to_f32(g + i, buf, n, dtype_);
    for (size_t j = 0; j < n; ++j) sum += static_cast<double>(buf[j]) * buf[j];
  }
  return sum;
}

float HostOffloadAdam::sum_over_dp(float v) {
  device::Device& dev = device::get_device(dp_.device_type());
  dev.copy(dev_scalar_, &v, 4);
  dp_.all_reduce(dev_scalar_, dev_scalar_, 1, DType::kF32, comm::ReduceOp::kSum, options_.timeout)->wait();
  dev.copy(&v, dev_scalar_, 4);
  return v;
}

HostOffloadStep HostOffloadAdam::step(float grad_scale) {
  device::Device& dev = device::get_device(dp_.device_type());
  const size_t bytes = shard_ * dtype_size(dtype_);
  const bool f32 = dtype_ == DType::kF32;
  // 1-2: the summed gradient shard, on the host.
  dp_.reduce_scatter(grads_, dev_grad_shard_, shard_, dtype_, comm::ReduceOp::kSum, options_.timeout)->wait();
  void* host_grad = f32 ? static_cast<void*>(host_grad32_.data()) : static_cast<void*>(host_grad16_.data());
  dev.copy(host_grad, dev_grad_shard_, bytes);
  // The norm of the mean gradient times grad_scale, over every rank.
  const double scale = static_cast<double>(grad_scale) / dp_.size();
  // The squared norm of this shard of the mean gradient, scaled before it
  // is narrowed to f32 (the loss-scaled sum would overflow f32 first).
  const float total = sum_over_dp(static_cast<float>(grad_sum_squares(host_grad) * scale * scale));
  HostOffloadStep out;
  out.grad_norm = std::sqrt(static_cast<double>(total));
  if (!std::isfinite(out.grad_norm)) {
    out.skipped = true;
    TORUS_LOG_WARN("HostOffloadAdam: the gradient norm is {} at step {}: the update is skipped", out.grad_norm,
                   steps_ + 1);
    return out;
  }
  if (options_.max_grad_norm > 0) out.clip_coef = std::min(1.0, options_.max_grad_norm / (out.grad_norm + 1e-6));
  // 3: Adam on the master shard, the mean gradient, the rounded write-back.
  void* host_param = f32 ? static_cast<void*>(host_param32_.data()) : static_cast<void*>(host_param16_.data());
  const size_t elt = dtype_size(dtype_);
  std::vector<cpu::AdamHyper> hypers;
  std::vector<cpu::AdamSlice> slices;
  for (const Segment& seg : segments_) {
    cpu::AdamHyper h = options_.adam;
    h.step = steps_ + 1;
    h.found_inf = nullptr;
    h.grad_scale = static_cast<float>(scale * out.clip_coef);
    h.weight_decay = seg.weight_decay;
    h.lr = options_.adam.lr * seg.lr_scale;
    cpu::AdamSlice sl;
    sl.param = master_.data() + seg.begin;
    sl.grad = static_cast<const char*>(host_grad) + seg.begin * elt;
    sl.grad_dtype = kernel_dtype(dtype_);
    sl.exp_avg = exp_avg_.data() + seg.begin;
    sl.exp_avg_sq = exp_avg_sq_.data() + seg.begin;
    sl.param_out = static_cast<char*>(host_param) + seg.begin * elt;
    sl.out_dtype = kernel_dtype(dtype_);
    sl.numel = static_cast<int64_t>(seg.end - seg.begin);
    hypers.push_back(h);
    slices.push_back(sl);
  }
  cpu::adam_update(hypers, slices, options_.threads);
  ++steps_;
  // 4: every rank's updated shard, everywhere.
  dev.copy(dev_param_shard_, host_param, bytes);
  dp_.all_gather(dev_param_shard_, params_, shard_, dtype_, options_.timeout)->wait();
  return out;
}

void HostOffloadAdam::publish_params() {
  device::Device& dev = device::get_device(dp_.device_type());
  const size_t bytes = shard_ * dtype_size(dtype_);
  void* host_param;
  if (dtype_ == DType::kF32) {
    std::copy(master_.begin(), master_.end(), host_param32_.begin());
    host_param = host_param32_.data();
  } else {
    kernels::f32_to_half(master_.data(), host_param16_.data(), shard_, dtype_);
    host_param = host_param16_.data();
  }
  std::string error;
  try {
    dev.copy(dev_param_shard_, host_param, bytes);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!comm::all_ok(dp_, error.empty(), options_.timeout)) {
    throw Error(fmt::format("HostOffloadAdam: writing the loaded parameters to the device failed{}",
                            error.empty() ? " on another rank" : ": " + error));
  }
  dp_.all_gather(dev_param_shard_, params_, shard_, dtype_, options_.timeout)->wait();
}

FlatState HostOffloadAdam::state_dict() const {
  FlatState s;
  const auto shard = [&](const char* name, const std::vector<float>& v) {
    return FlatTensor{name, DType::kF32, numel_, offset_, shard_, v.data(), false};
  };
  s.tensors = {shard(kMaster, master_), shard(kExpAvg, exp_avg_), shard(kExpAvgSq, exp_avg_sq_),
               FlatTensor{kStepCount, DType::kI64, 1, 0, 1, &steps_, true}};
  s.meta = {{"optimizer", kOptimizer}, {"param_dtype", std::string(dtype_name(dtype_))}};
  return s;
}

void HostOffloadAdam::load_state_dict(const FlatState& state) {
  const FlatState mine = state_dict();
  TORUS_CHECK(state.meta == mine.meta, InvalidArgument,
              "HostOffloadAdam: the state is of {} ({} parameters), this optimizer is {} ({} parameters)",
              state.meta.count("optimizer") ? state.meta.at("optimizer") : "another optimizer",
              state.meta.count("param_dtype") ? state.meta.at("param_dtype") : "unknown",
              mine.meta.at("optimizer"), mine.meta.at("param_dtype"));
  TORUS_CHECK(state.tensors.size() == mine.tensors.size(), InvalidArgument,
              "HostOffloadAdam: the state holds {} tensors, not {}", state.tensors.size(), mine.tensors.size());
  for (const FlatTensor& want : mine.tensors) {
    const FlatTensor* t = state.find(want.name);
    TORUS_CHECK(t != nullptr, InvalidArgument, "HostOffloadAdam: the state lacks '{}'", want.name);
    TORUS_CHECK(t->dtype == want.dtype && t->global_numel == want.global_numel && t->offset == want.offset &&
                    t->numel == want.numel && t->data != nullptr,
                InvalidArgument,
                "HostOffloadAdam: '{}' is {} elements [{}, +{}) of {} in the state, {} [{}, +{}) of {} here",
                want.name, dtype_name(t->dtype), t->offset, t->numel, t->global_numel, dtype_name(want.dtype),
                want.offset, want.numel, want.global_numel);
  }
  int64_t steps = 0;
  std::memcpy(&steps, state.find(kStepCount)->data, sizeof steps);
  TORUS_CHECK(steps >= 0, InvalidArgument, "HostOffloadAdam: the state's step count {} is negative", steps);
  const auto take = [&](const char* name, std::vector<float>& into) {
    const float* from = static_cast<const float*>(state.find(name)->data);
    std::copy(from, from + shard_, into.begin());
  };
  take(kMaster, master_);
  take(kExpAvg, exp_avg_);
  take(kExpAvgSq, exp_avg_sq_);
  steps_ = steps;
  publish_params();
}

}  // namespace torus::optim
