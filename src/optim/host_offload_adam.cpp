// HostOffloadAdam (torus/optim/host_offload_adam.h): reduce-scatter on the
// device, Adam on the host, all-gather on the device.
#include "torus/optim/host_offload_adam.h"

#include "core/log.h"
#include "kernels/cpu/reduce.h"
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

}  // namespace

size_t HostOffloadAdam::padded_numel(size_t numel, int dp_size) {
  TORUS_CHECK(dp_size >= 1, InvalidArgument, "HostOffloadAdam: dp size {} must be >= 1", dp_size);
  size_t d = static_cast<size_t>(dp_size);
  return (numel + d - 1) / d * d;
}

HostOffloadAdam::HostOffloadAdam(comm::Backend& dp, void* params, void* grads, size_t numel, DType dtype,
                                 HostOffloadAdamOptions options)
    : dp_(dp), params_(params), grads_(grads), numel_(numel), dtype_(dtype), options_(options) {
  kernel_dtype(dtype);
  const size_t d = static_cast<size_t>(dp.size());
  TORUS_CHECK(numel > 0 && numel % d == 0, InvalidArgument,
              "HostOffloadAdam: {} elements do not split evenly over {} data-parallel ranks; pad the buffers to "
              "padded_numel() = {}",
              numel, d, padded_numel(numel, dp.size()));
  TORUS_CHECK(params != nullptr && grads != nullptr && params != grads, InvalidArgument,
              "HostOffloadAdam: params and grads must be two distinct non-null buffers");
  TORUS_CHECK(dp.supports(comm::OpType::kReduceScatter, dtype, comm::ReduceOp::kSum) &&
                  dp.supports(comm::OpType::kAllGather, dtype),
              Unsupported, "HostOffloadAdam: the '{}' backend of group '{}' cannot reduce-scatter and all-gather {}",
              dp.name(), dp.group().name, dtype_name(dtype));
  shard_ = numel / d;
  offset_ = shard_ * static_cast<size_t>(dp.rank());
  const size_t elt = dtype_size(dtype);
  device::Device& dev = device::get_device(dp.device_type());
  dev_grad_shard_ = dev.allocate(shard_ * elt);
  try {
    dev_param_shard_ = dev.allocate(shard_ * elt);
  } catch (...) {
    dev.deallocate(dev_grad_shard_);
    throw;
  }
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
}

HostOffloadAdam::~HostOffloadAdam() {
  device::Device& dev = device::get_device(dp_.device_type());
  dev.deallocate(dev_grad_shard_);
  dev.deallocate(dev_param_shard_);
}

void HostOffloadAdam::step(float grad_scale) {
  device::Device& dev = device::get_device(dp_.device_type());
  const size_t bytes = shard_ * dtype_size(dtype_);
  const bool f32 = dtype_ == DType::kF32;
  // 1-2: the summed gradient shard, on the host.
  dp_.reduce_scatter(grads_, dev_grad_shard_, shard_, dtype_, comm::ReduceOp::kSum, options_.timeout)->wait();
  void* host_grad = f32 ? static_cast<void*>(host_grad32_.data()) : static_cast<void*>(host_grad16_.data());
  void* host_param = f32 ? static_cast<void*>(host_param32_.data()) : static_cast<void*>(host_param16_.data());
  dev.copy(host_grad, dev_grad_shard_, bytes);
  // 3: Adam on the master shard, the mean gradient, the rounded write-back.
  cpu::AdamHyper h = options_.adam;
  h.step = steps_ + 1;
  h.found_inf = nullptr;
  h.grad_scale = grad_scale / static_cast<float>(dp_.size());
  cpu::AdamSlice s;
  s.param = master_.data();
  s.grad = host_grad;
  s.grad_dtype = kernel_dtype(dtype_);
  s.exp_avg = exp_avg_.data();
  s.exp_avg_sq = exp_avg_sq_.data();
  s.param_out = host_param;
  s.out_dtype = kernel_dtype(dtype_);
  s.numel = static_cast<int64_t>(shard_);
  cpu::adam_update(h, s, options_.threads);
  ++steps_;
  // 4: every rank's updated shard, everywhere.
  dev.copy(dev_param_shard_, host_param, bytes);
  dp_.all_gather(dev_param_shard_, params_, shard_, dtype_, options_.timeout)->wait();
}

}  // namespace torus::optim
