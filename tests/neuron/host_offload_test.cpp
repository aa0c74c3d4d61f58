// HostOffloadAdam (torus/optim/host_offload_adam.h) on Neuron device buffers
// over the neuron backend and the fake runtime: the parameters every rank
// ends with equal a plain single-process Adam/AdamW on the mean gradient,
// written here from torch.optim's formula (Note [CPU Adam order] in
// cpu_adam_kernel.h), independent of the kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend_fixture.h"
#include "kernels/cpu/reduce.h"
#include "torus/core/error.h"
#include "torus/device/device.h"
#include "torus/optim/host_offload_adam.h"

namespace torus::comm::test {
namespace {

device::Device& dev() { return device::get_device(DeviceType::kNeuron); }

// The gradient rank r contributes to element i at step t (exact in bf16).
float grad_of(int r, size_t i, int t) { return static_cast<float>(static_cast<int>((i * 7 + r * 3 + t) % 11) - 5) / 4; }
float init_of(size_t i) { return static_cast<float>(static_cast<int>(i % 13) - 6) / 8; }

// torch.optim.Adam(W) on one element in double, then rounded: the reference.
struct RefAdam {
  double lr, b1, b2, eps, wd;
  bool decoupled;
  void step(double& p, double& m, double& v, double g, int t) const {
    if (wd != 0 && decoupled) p *= 1 - lr * wd;
    if (wd != 0 && !decoupled) g += wd * p;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

void run_case(DType dtype, bool decoupled, double wd) {
  Backend& w = world();
  const size_t numel = optim::HostOffloadAdam::padded_numel(1001, w.size());
  const size_t elt = dtype_size(dtype);
  device::DeviceBuffer params(DeviceType::kNeuron, numel * elt), grads(DeviceType::kNeuron, numel * elt);
  auto upload = [&](void* dst, const std::vector<float>& v) {
    if (dtype == DType::kF32) {
      dev().copy(dst, v.data(), numel * elt);
    } else {
      std::vector<uint16_t> h(numel);
      kernels::f32_to_half(v.data(), h.data(), numel, dtype);
      dev().copy(dst, h.data(), numel * elt);
    }
  };
  auto download = [&](const void* src) {
    std::vector<float> v(numel);
    if (dtype == DType::kF32) {
      dev().copy(v.data(), src, numel * elt);
    } else {
      std::vector<uint16_t> h(numel);
      dev().copy(h.data(), src, numel * elt);
      kernels::half_to_f32(h.data(), v.data(), numel, dtype);
    }
    return v;
  };
  std::vector<float> p0(numel);
  for (size_t i = 0; i < numel; ++i) p0[i] = init_of(i);
  upload(params.data(), p0);
  optim::HostOffloadAdamOptions o;
  o.adam.lr = 0.01;
  o.adam.weight_decay = wd;
  o.adam.decoupled = decoupled;
  o.timeout = op_timeout();
  optim::HostOffloadAdam opt(w, params.data(), grads.data(), numel, dtype, o);
  EXPECT_EQ(opt.shard_numel() * static_cast<size_t>(w.size()), numel);
  RefAdam ref{o.adam.lr, o.adam.beta1, o.adam.beta2, o.adam.eps, wd, decoupled};
  // The reference starts from the parameters as stored (rounded to dtype).
  std::vector<double> rp(numel), rm(numel, 0), rv(numel, 0);
  std::vector<float> stored = download(params.data());
  for (size_t i = 0; i < numel; ++i) rp[i] = stored[i];
  const int steps = 4;
  for (int t = 1; t <= steps; ++t) {
    std::vector<float> g(numel);
    for (size_t i = 0; i < numel; ++i) g[i] = grad_of(w.rank(), i, t);
    upload(grads.data(), g);
    opt.step();
    for (size_t i = 0; i < numel; ++i) {
      double mean = 0;
      for (int r = 0; r < w.size(); ++r) mean += grad_of(r, i, t);
      ref.step(rp[i], rm[i], rv[i], mean / w.size(), t);
    }
  }
  EXPECT_EQ(opt.steps(), steps);
  std::vector<float> got = download(params.data());
  // f32: the float kernel against the double reference; 16-bit: one
  // rounding of the result (the master weights stay fp32).
  const double tol = dtype == DType::kF32 ? 2e-6 : dtype == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
  size_t bad = 0;
  for (size_t i = 0; i < numel; ++i) {
    if (std::fabs(got[i] - rp[i]) > tol * std::max(1.0, std::fabs(rp[i]))) {
      if (bad++ < 5) ADD_FAILURE() << "element " << i << ": got " << got[i] << ", reference " << rp[i];
    }
  }
  EXPECT_EQ(bad, 0u);
  // The master shard is fp32 and matches the reference closely in every dtype.
  for (size_t j = 0; j < opt.shard_numel(); j += 97) {
    EXPECT_NEAR(opt.master()[j], rp[opt.shard_offset() + j], 2e-6 * std::max(1.0, std::fabs(rp[opt.shard_offset() + j])));
  }
}

TEST(HostOffloadAdam, AdamWOnF32NeuronBuffersEqualsTheReference) { run_case(DType::kF32, true, 0.1); }
TEST(HostOffloadAdam, AdamOnBF16NeuronBuffersEqualsTheReference) { run_case(DType::kBF16, false, 0.01); }
TEST(HostOffloadAdam, F16WithoutWeightDecay) { run_case(DType::kF16, true, 0.0); }

TEST(HostOffloadAdam, RefusesBadBuffers) {
  Backend& w = world();
  device::DeviceBuffer a(DeviceType::kNeuron, 4096), b(DeviceType::kNeuron, 4096);
  if (w.size() > 1) {
    EXPECT_THROW(optim::HostOffloadAdam(w, a.data(), b.data(), static_cast<size_t>(w.size()) + 1, DType::kF32),
                 InvalidArgument);
  }
  EXPECT_THROW(optim::HostOffloadAdam(w, a.data(), b.data(), 0, DType::kF32), InvalidArgument);
  EXPECT_THROW(optim::HostOffloadAdam(w, a.data(), a.data(), 64, DType::kF32), InvalidArgument);
  EXPECT_THROW(optim::HostOffloadAdam(w, a.data(), b.data(), 64, DType::kI32), InvalidArgument);
  EXPECT_EQ(optim::HostOffloadAdam::padded_numel(1001, 4), 1004u);
}

}  // namespace
}  // namespace torus::comm::test
