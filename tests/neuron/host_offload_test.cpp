// HostOffloadAdam (torus/optim/host_offload_adam.h) on Neuron device buffers
// over the neuron backend and the fake runtime: the parameters every rank
// ends with equal a plain single-process Adam/AdamW on the mean gradient,
// written here from torch.optim's formula (Note [CPU Adam order] in
// cpu_adam_kernel.h), independent of the kernel.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend_fixture.h"
#include "device_buffers.h"
#include <fmt/format.h>

#include "checkpoint/file_io.h"
#include "kernels/cpu/reduce.h"
#include "torus/checkpoint/flat_state.h"
#include "torus/checkpoint/safetensors.h"
#include "torus/core/error.h"
#include "torus/device/device.h"
#include "torus/optim/host_offload_adam.h"

namespace torus::comm::test {
namespace {


// The gradient rank r contributes to element i at step t (exact in bf16).
float grad_of(int r, size_t i, int t) { return static_cast<float>(static_cast<int>((i * 7 + r * 3 + t) % 11) - 5) / 4; }
float init_of(size_t i) { return static_cast<float>(static_cast<int>(i % 13) - 6) / 8; }

// torch.optim.Adam(W) on one element in double, then rounded: the reference.
struct RefAdam {
  double lr, b1, b2, eps, wd;
  bool decoupled;
  void step(double& p, double& m, double& v, double g, int t) const { step_with(p, m, v, g, t, lr, wd); }
  void step_with(double& p, double& m, double& v, double g, int t, double lr, double wd) const {
    if (wd != 0 && decoupled) p *= 1 - lr * wd;
    if (wd != 0 && !decoupled) g += wd * p;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

// Device buffers of `numel` elements of `dtype`, written and read as f32.
struct Flat {
  Flat(DType t, size_t n) : dtype(t), numel(n), mem(DeviceType::kNeuron, n * dtype_size(t)) {}
  void upload(const std::vector<float>& v) {
    if (dtype == DType::kF32) {
      dev().copy(mem.data(), v.data(), numel * 4);
    } else {
      std::vector<uint16_t> h(numel);
      kernels::f32_to_half(v.data(), h.data(), numel, dtype);
      dev().copy(mem.data(), h.data(), numel * 2);
    }
  }
  std::vector<float> download() const {
    std::vector<float> v(numel);
    if (dtype == DType::kF32) {
      dev().copy(v.data(), mem.data(), numel * 4);
    } else {
      std::vector<uint16_t> h(numel);
      dev().copy(h.data(), mem.data(), numel * 2);
      kernels::half_to_f32(h.data(), v.data(), numel, dtype);
    }
    return v;
  }
  DType dtype;
  size_t numel;
  device::DeviceBuffer mem;
};

// The plain reference of a whole run: parameters, moments, steps.
struct RefRun {
  RefAdam adam;
  std::vector<optim::HostOffloadAdamGroup> groups;
  double max_norm = 0;
  std::vector<double> p, m, v;
  int t = 0;
  void step(const std::function<double(size_t)>& mean_grad) {
    ++t;
    const size_t n = p.size();
    std::vector<double> g(n);
    double sq = 0;
    for (size_t i = 0; i < n; ++i) {
      g[i] = mean_grad(i);
      sq += g[i] * g[i];
    }
    const double coef = max_norm > 0 ? std::min(1.0, max_norm / (std::sqrt(sq) + 1e-6)) : 1.0;
    for (size_t i = 0; i < n; ++i) {
      double lr = adam.lr, wd = adam.wd;
      for (const auto& gr : groups) {
        if (i >= gr.offset && i < gr.offset + gr.numel) {
          lr = adam.lr * gr.lr_scale;
          wd = gr.weight_decay;
        }
      }
      adam.step_with(p[i], m[i], v[i], g[i] * coef, t, lr, wd);
    }
  }
};

double mean_grad(int world_size, size_t i, int t) {
  double mean = 0;
  for (int r = 0; r < world_size; ++r) mean += grad_of(r, i, t);
  return mean / world_size;
}

// Checks the device parameters against the reference, within one rounding
// of the dtype (f32: the float kernel against double).
void expect_params(const std::vector<float>& got, const std::vector<double>& want, DType dtype) {
  const double tol = dtype == DType::kF32 ? 2e-6 : dtype == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > tol * std::max(1.0, std::fabs(want[i]))) {
      if (bad++ < 5) ADD_FAILURE() << "element " << i << ": got " << got[i] << ", reference " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u);
}

// Parameters of 1001 elements padded for this world, holding init_of(i).
Flat initial_params(DType dtype) {
  Flat params(dtype, optim::HostOffloadAdam::padded_numel(1001, world().size()));
  std::vector<float> p0(params.numel);
  for (size_t i = 0; i < params.numel; ++i) p0[i] = init_of(i);
  params.upload(p0);
  return params;
}

void run_case(DType dtype, bool decoupled, double wd, const std::vector<optim::HostOffloadAdamGroup>& groups = {},
              double max_norm = 0) {
  Backend& w = world();
  Flat params = initial_params(dtype);
  const size_t numel = params.numel;
  Flat grads(dtype, numel);
  optim::HostOffloadAdamOptions o;
  o.adam.lr = 0.01;
  o.adam.weight_decay = wd;
  o.adam.decoupled = decoupled;
  o.groups = groups;
  o.max_grad_norm = max_norm;
  o.timeout = op_timeout();
  optim::HostOffloadAdam opt(w, params.mem.data(), grads.mem.data(), numel, dtype, o);
  EXPECT_EQ(opt.shard_numel() * static_cast<size_t>(w.size()), numel);
  RefRun ref{{o.adam.lr, o.adam.beta1, o.adam.beta2, o.adam.eps, wd, decoupled}, groups, max_norm, {}, {}, {}, 0};
  // The reference starts from the parameters as stored (rounded to dtype).
  std::vector<float> stored = params.download();
  ref.p.assign(stored.begin(), stored.end());
  ref.m.assign(numel, 0);
  ref.v.assign(numel, 0);
  const int steps = 4;
  for (int t = 1; t <= steps; ++t) {
    std::vector<float> g(numel);
    for (size_t i = 0; i < numel; ++i) g[i] = grad_of(w.rank(), i, t);
    grads.upload(g);
    optim::HostOffloadStep st = opt.step();
    double sq = 0;
    for (size_t i = 0; i < numel; ++i) sq += mean_grad(w.size(), i, t) * mean_grad(w.size(), i, t);
    EXPECT_NEAR(st.grad_norm, std::sqrt(sq), 1e-5 * std::sqrt(sq));
    EXPECT_FALSE(st.skipped);
    if (max_norm > 0) EXPECT_LT(st.clip_coef, 1.0) << "the case is meant to clip";
    ref.step([&](size_t i) { return mean_grad(w.size(), i, t); });
  }
  EXPECT_EQ(opt.steps(), steps);
  expect_params(params.download(), ref.p, dtype);
  // The master shard is fp32 and matches the reference closely in every dtype.
  for (size_t j = 0; j < opt.shard_numel(); j += 97) {
    EXPECT_NEAR(opt.master()[j], ref.p[opt.shard_offset() + j], 2e-6 * std::max(1.0, std::fabs(ref.p[opt.shard_offset() + j])));
  }
}

TEST(HostOffloadAdam, AdamWOnF32NeuronBuffersEqualsTheReference) { run_case(DType::kF32, true, 0.1); }
TEST(HostOffloadAdam, AdamOnBF16NeuronBuffersEqualsTheReference) { run_case(DType::kBF16, false, 0.01); }
TEST(HostOffloadAdam, F16WithoutWeightDecay) { run_case(DType::kF16, true, 0.0); }

// Two groups — one without weight decay, one at half the lr — that cross the
// ranks' shard boundaries, and clipping to a norm below the gradients'.
TEST(HostOffloadAdam, GroupsAndClippingEqualTheReference) {
  const size_t numel = optim::HostOffloadAdam::padded_numel(1001, world().size());
  std::vector<optim::HostOffloadAdamGroup> groups = {{numel / 4 - 3, numel / 4, 0.0, 1.0},
                                                     {numel / 2 + 10, numel / 4, 0.05, 0.5}};
  run_case(DType::kF32, true, 0.1, groups, 0.5);
  run_case(DType::kBF16, true, 0.1, groups, 0.5);
}

TEST(HostOffloadAdam, ANonFiniteGradientSkipsTheStepOnEveryRank) {
  Backend& w = world();
  const size_t numel = optim::HostOffloadAdam::padded_numel(64, w.size());
  Flat params(DType::kF16, numel), grads(DType::kF16, numel);
  std::vector<float> p0(numel, 0.5f), g(numel, 0.25f);
  params.upload(p0);
  optim::HostOffloadAdamOptions o;
  o.timeout = op_timeout();
  optim::HostOffloadAdam opt(w, params.mem.data(), grads.mem.data(), numel, DType::kF16, o);
  // One rank's f16 gradient overflowed.
  if (w.rank() == w.size() - 1) g[5] = std::numeric_limits<float>::infinity();
  grads.upload(g);
  optim::HostOffloadStep st = opt.step();
  EXPECT_TRUE(st.skipped);
  EXPECT_FALSE(std::isfinite(st.grad_norm));
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_EQ(params.download(), p0);
  // The next finite step runs as the first.
  std::fill(g.begin(), g.end(), 0.25f);
  grads.upload(g);
  st = opt.step();
  EXPECT_FALSE(st.skipped);
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_NEAR(st.grad_norm, 0.25 * std::sqrt(static_cast<double>(numel)), 1e-4);
}

// A directory every rank of this job agrees on, removed at the end.
struct SharedDir {
  explicit SharedDir(const std::string& name)
      : path(fmt::format("{}/torus-host-adam-{}-{}", std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                         ::getppid(), name)) {}
  ~SharedDir() {
    wait_ok(world().barrier(op_timeout()), "barrier before removing the directory");
    if (world().rank() == 0) ckpt::remove_tree(path);
  }
  std::string path;
};

// The state of `opt` saved in the checkpoint format as step opt.steps()
// under `dir`, and loaded back (collective over `g`).
std::string save_state(Backend& g, const optim::HostOffloadAdam& opt, const std::string& dir) {
  ckpt::RunInfo info;
  info.run_id = "host-adam-test";
  info.step = opt.steps();
  ckpt::FlatSaveOptions so;
  so.timeout = op_timeout();
  return ckpt::save_flat_state(g, dir, opt.state_dict(), info, so);
}
void load_state(Backend& g, optim::HostOffloadAdam& opt, const std::string& path) {
  opt.load_state_dict(ckpt::read_flat_state(g, path, opt.state_dict(), op_timeout()).state());
}

// save, two more steps; a fresh optimizer (other parameters) loads and takes
// the same two steps: equal parameters and state. Then the state loads on
// every dp size that divides the elements — here one rank alone — into the
// same master weights, and corrupt or mismatched states are refused on every
// rank without changing anything.
TEST(HostOffloadAdam, SaveAndLoadResumeExactlyOnAnyDpSize) {
  Backend& w = world();
  SharedDir dir("resume");
  const DType dtype = DType::kBF16;
  Flat params = initial_params(dtype);
  const size_t numel = params.numel;
  Flat grads(dtype, numel);
  optim::HostOffloadAdamOptions o;
  o.adam.lr = 0.01;
  o.adam.weight_decay = 0.1;
  o.max_grad_norm = 1.0;
  o.groups = {{10, 100, 0.0, 1.0}};
  o.timeout = op_timeout();
  auto run = [&](optim::HostOffloadAdam& opt, int from, int to) {
    for (int t = from; t <= to; ++t) {
      std::vector<float> g(numel);
      for (size_t i = 0; i < numel; ++i) g[i] = grad_of(w.rank(), i, t);
      grads.upload(g);
      opt.step();
    }
  };
  optim::HostOffloadAdam a(w, params.mem.data(), grads.mem.data(), numel, dtype, o);
  run(a, 1, 2);
  const std::string saved = save_state(w, a, dir.path);
  const std::vector<float> master_at_save(a.master(), a.master() + a.shard_numel());
  run(a, 3, 4);
  const std::vector<float> after = params.download();

  Flat other(dtype, numel);
  other.upload(std::vector<float>(numel, 0.0f));
  optim::HostOffloadAdam b(w, other.mem.data(), grads.mem.data(), numel, dtype, o);
  load_state(w, b, saved);
  EXPECT_EQ(b.steps(), 2);
  EXPECT_EQ(std::vector<float>(b.master(), b.master() + b.shard_numel()), master_at_save);
  run(b, 3, 4);
  EXPECT_EQ(other.download(), after) << "the resumed run differs from the uninterrupted one";
  EXPECT_EQ(std::vector<float>(b.exp_avg(), b.exp_avg() + b.shard_numel()),
            std::vector<float>(a.exp_avg(), a.exp_avg() + a.shard_numel()));

  // One rank alone (dp = 1) reads every rank's file.
  BackendPtr alone = w.split(w.rank(), 0, "alone", op_timeout());
  Flat solo(dtype, numel), solo_grads(dtype, numel);
  solo.upload(std::vector<float>(numel, 0.0f));
  optim::HostOffloadAdam c(*alone, solo.mem.data(), solo_grads.mem.data(), numel, dtype, o);
  load_state(*alone, c, saved);
  EXPECT_EQ(c.shard_numel(), numel);
  std::vector<float> mine(c.master() + a.shard_offset(), c.master() + a.shard_offset() + a.shard_numel());
  EXPECT_EQ(mine, master_at_save);
  std::vector<float> rounded = solo.download();
  for (size_t i = 0; i < numel; i += 101) EXPECT_NEAR(rounded[i], c.master()[i], 1.0 / 128 * std::max(1.0f, std::fabs(c.master()[i])));

  // Refusals, on every rank, with the state unchanged.
  const std::vector<float> before(b.master(), b.master() + b.shard_numel());
  const size_t more = numel + static_cast<size_t>(w.size());
  Flat wrong(dtype, more), wrong_grads(dtype, more);
  optim::HostOffloadAdam d(w, wrong.mem.data(), wrong_grads.mem.data(), more, dtype, o);
  EXPECT_THROW(load_state(w, d, saved), ckpt::CheckpointError);  // another number of elements
  Flat f32(DType::kF32, numel), f32_grads(DType::kF32, numel);
  optim::HostOffloadAdam e(w, f32.mem.data(), f32_grads.mem.data(), numel, DType::kF32, o);
  EXPECT_THROW(load_state(w, e, saved), ckpt::CheckpointError);  // saved for bf16
  // The same refusals from the optimizer itself, before any collective.
  EXPECT_THROW(d.load_state_dict(b.state_dict()), InvalidArgument);
  EXPECT_THROW(e.load_state_dict(b.state_dict()), InvalidArgument);
  if (w.rank() == 0) {  // one byte of the last rank's file changes
    const std::string f = fmt::format("{}/rank-{:05d}.safetensors", saved, w.size() - 1);
    FILE* fp = std::fopen(f.c_str(), "r+b");
    ASSERT_NE(fp, nullptr);
    std::fseek(fp, -3, SEEK_END);
    std::fputc(0x5a, fp);
    std::fclose(fp);
  }
  wait_ok(w.barrier(op_timeout()), "barrier after the corruption");
  try {
    load_state(w, b, saved);
    ADD_FAILURE() << "a corrupt state was loaded";
  } catch (const ckpt::CheckpointError& err) {
    if (w.rank() == w.size() - 1) EXPECT_NE(std::string(err.what()).find("SHA-256"), std::string::npos) << err.what();
  }
  EXPECT_EQ(std::vector<float>(b.master(), b.master() + b.shard_numel()), before);
  EXPECT_EQ(b.steps(), 4);
  SharedDir empty("empty");
  EXPECT_THROW(load_state(w, b, empty.path), ckpt::CheckpointError);  // no checkpoint
}

// A save that fails on one rank (a full disk on the last one) fails on
// every rank and publishes nothing: the step has no checkpoint and its
// temporary directory is gone; the same save succeeds afterwards.
TEST(HostOffloadAdam, AnInterruptedSaveLeavesNoCheckpoint) {
  Backend& w = world();
  SharedDir dir("interrupted");
  const DType dtype = DType::kF32;
  Flat params = initial_params(dtype);
  Flat grads(dtype, params.numel);
  optim::HostOffloadAdamOptions o;
  o.timeout = op_timeout();
  optim::HostOffloadAdam opt(w, params.mem.data(), grads.mem.data(), params.numel, dtype, o);
  const std::string step = fmt::format("{}/step-{:08d}", dir.path, 0);
  if (w.rank() == w.size() - 1) ckpt::inject_write_failure(100);
  try {
    save_state(w, opt, dir.path);
    ADD_FAILURE() << "a save with a full disk on rank " << w.size() - 1 << " succeeded";
  } catch (const ckpt::CheckpointError& err) {
    if (w.rank() == w.size() - 1) {
      EXPECT_NE(std::string(err.what()).find("No space left on device"), std::string::npos) << err.what();
    }
  }
  ckpt::inject_write_failure(-1);
  wait_ok(w.barrier(op_timeout()), "barrier after the failed save");
  EXPECT_NE(::access((step + "/COMPLETE").c_str(), F_OK), 0);
  EXPECT_NE(::access((step + ".tmp-host-adam-test").c_str(), F_OK), 0);
  EXPECT_THROW(load_state(w, opt, step), ckpt::CheckpointError);
  EXPECT_EQ(save_state(w, opt, dir.path), step);
  load_state(w, opt, step);
  EXPECT_EQ(opt.steps(), 0);
}

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
