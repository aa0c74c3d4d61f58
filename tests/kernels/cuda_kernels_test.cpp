// The CUDA kernels against their CPU references (kernels/ref/): fused AdamW
// for every gradient/model dtype pair, gradient unscale with inf/NaN
// detection, and the casts — on odd sizes, chunk boundaries, misaligned
// buffers and more tensors than one launch holds. The launchers' argument
// checks run without a GPU; everything else skips, with the reason, when no
// GPU is present.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "device/gpu_test_util.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/unscale.h"
#include "kernels/ref/adamw_ref.h"
#include "kernels/ref/cast_ref.h"
#include "kernels/ref/half.h"
#include "kernels/ref/unscale_ref.h"
#include "torus/core/error.h"
#include "torus/device/device.h"

namespace torus::kernels {
namespace {

using device::DeviceBuffer;

// --- argument checks: no GPU needed (they throw before touching CUDA) ---------

TEST(CudaKernelArgs, RejectedBeforeLaunch) {
  float x = 0;
  EXPECT_THROW(cuda::cast(&x, DType::kF32, &x, DType::kI32, 1, nullptr), InvalidArgument);
  EXPECT_THROW(cuda::cast(nullptr, DType::kF32, &x, DType::kBF16, 1, nullptr), InvalidArgument);
  GradTensor g{&x, 1};
  EXPECT_THROW(cuda::unscale_grads({&g, 1}, DType::kF32, 1.0f, nullptr, nullptr), InvalidArgument);
  EXPECT_THROW(cuda::unscale_grads({&g, 1}, DType::kI64, 1.0f, &x, nullptr), InvalidArgument);
  AdamWTensor t{&x, &x, &x, &x, nullptr, 1};
  AdamWConfig c;
  c.beta1 = 1.0f;
  EXPECT_THROW(cuda::adamw_step({&t, 1}, DType::kF32, DType::kF32, c, nullptr, nullptr), InvalidArgument);
  EXPECT_THROW(cuda::adamw_step({&t, 1}, DType::kU8, DType::kF32, AdamWConfig{}, nullptr, nullptr), InvalidArgument);
}

// --- GPU tests ---------------------------------------------------------------

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override { TORUS_REQUIRE_ACCELERATOR(); }

  device::Device& dev() { return device::get_device(DeviceType::kCUDA); }

  template <typename T>
  DeviceBuffer upload(const std::vector<T>& v) {
    DeviceBuffer b(DeviceType::kCUDA, std::max<size_t>(v.size(), 1) * sizeof(T));
    dev().copy(b.data(), v.data(), v.size() * sizeof(T));
    return b;
  }
  template <typename T>
  std::vector<T> download(const DeviceBuffer& b, size_t n, size_t offset = 0) {
    std::vector<T> v(n);
    dev().synchronize();
    dev().copy(v.data(), b.as<T>() + offset, n * sizeof(T));
    return v;
  }
};

uint16_t encode(float f, DType t) { return t == DType::kBF16 ? ref::f32_to_bf16(f) : ref::f32_to_f16(f); }

// Raw bytes of n elements of dtype t filled from `values` (f32 or 16-bit).
std::vector<uint8_t> encode_all(const std::vector<float>& values, DType t) {
  std::vector<uint8_t> out(values.size() * dtype_size(t));
  for (size_t i = 0; i < values.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&out[i * 4], &values[i], 4);
    } else {
      uint16_t h = encode(values[i], t);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

bool close(float a, float b, float rtol, float atol) { return std::fabs(a - b) <= atol + rtol * std::fabs(b); }

// One parameter tensor's host and device copies. `offset` elements of slack
// in front make the device buffers misaligned for vector loads.
struct AdamWCase {
  size_t n = 0;
  size_t offset = 0;
  std::vector<float> p, m, v;
  std::vector<uint8_t> g;
  std::vector<uint16_t> w;
  DeviceBuffer dp, dm, dv, dg, dw;
};

void check_adamw(DType grad_t, DType model_t, const std::vector<size_t>& sizes, size_t misaligned_every,
                 device::Device& dev) {
  std::mt19937 rng(static_cast<unsigned>(sizes.size() * 31 + static_cast<int>(grad_t) * 7 + static_cast<int>(model_t)));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const bool has_model = model_t != DType::kF32;
  std::vector<AdamWCase> cases(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    AdamWCase& c = cases[k];
    c.n = sizes[k];
    c.offset = misaligned_every != 0 && k % misaligned_every == 1 ? 1 : 0;
    size_t total = c.n + c.offset;
    c.p.resize(total);
    c.m.resize(total);
    c.v.resize(total);
    std::vector<float> gv(total);
    for (size_t i = 0; i < total; ++i) {
      c.p[i] = nd(rng);
      c.m[i] = 0.1f * nd(rng);
      c.v[i] = 0.01f * std::fabs(nd(rng));
      gv[i] = nd(rng);
    }
    c.g = encode_all(gv, grad_t);
    c.w.assign(total, 0);
    auto up = [&](const void* src, size_t bytes) {
      DeviceBuffer b(DeviceType::kCUDA, std::max<size_t>(bytes, 1));
      dev.copy(b.data(), src, bytes);
      return b;
    };
    c.dp = up(c.p.data(), total * 4);
    c.dm = up(c.m.data(), total * 4);
    c.dv = up(c.v.data(), total * 4);
    c.dg = up(c.g.data(), c.g.size());
    c.dw = up(c.w.data(), total * 2);
  }
  const size_t gsz = dtype_size(grad_t);
  for (int step = 1; step <= 3; ++step) {
    AdamWConfig cfg;
    cfg.step = step;
    cfg.lr = 1e-2f;
    cfg.weight_decay = 0.1f;
    cfg.inv_grad_scale = 0.5f;
    std::vector<AdamWTensor> host, gpu;
    for (AdamWCase& c : cases) {
      size_t o = c.offset;
      host.push_back({c.p.data() + o, c.g.data() + o * gsz, c.m.data() + o, c.v.data() + o,
                      has_model ? static_cast<void*>(c.w.data() + o) : nullptr, c.n});
      gpu.push_back({c.dp.as<float>() + o, c.dg.as<uint8_t>() + o * gsz, c.dm.as<float>() + o, c.dv.as<float>() + o,
                     has_model ? static_cast<void*>(c.dw.as<uint16_t>() + o) : nullptr, c.n});
    }
    adamw_step_ref(host, grad_t, model_t, cfg);
    cuda::adamw_step(gpu, grad_t, model_t, cfg, nullptr, nullptr);
  }
  dev.synchronize();
  for (size_t k = 0; k < cases.size(); ++k) {
    AdamWCase& c = cases[k];
    size_t total = c.n + c.offset;
    std::vector<float> p(total), m(total), v(total);
    std::vector<uint16_t> w(total);
    dev.copy(p.data(), c.dp.data(), total * 4);
    dev.copy(m.data(), c.dm.data(), total * 4);
    dev.copy(v.data(), c.dv.data(), total * 4);
    dev.copy(w.data(), c.dw.data(), total * 2);
    for (size_t i = c.offset; i < total; ++i) {
      ASSERT_TRUE(close(p[i], c.p[i], 1e-5f, 1e-6f)) << "param, tensor " << k << " elem " << i << ": " << p[i]
                                                     << " vs " << c.p[i];
      ASSERT_TRUE(close(m[i], c.m[i], 1e-5f, 1e-7f)) << "exp_avg, tensor " << k << " elem " << i;
      ASSERT_TRUE(close(v[i], c.v[i], 1e-5f, 1e-9f)) << "exp_avg_sq, tensor " << k << " elem " << i;
      if (has_model) {
        // The f32 results may differ in their last bit, which can move the
        // rounded 16-bit value to the neighbouring encoding, never further.
        ASSERT_LE(std::abs(static_cast<int>(w[i]) - static_cast<int>(c.w[i])), 1)
            << "model copy, tensor " << k << " elem " << i;
      }
    }
  }
}

const std::vector<size_t> kOddSizes = {0, 1, 3, 4, 5, 1000, 65535, 65536, 65537, 200003};

TEST_F(CudaKernels, AdamWMatchesReferenceForEveryDtypePair) {
  for (DType g : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType w : {DType::kF32, DType::kBF16, DType::kF16}) {  // kF32: no model copy
      SCOPED_TRACE(::testing::Message() << "grad " << dtype_name(g) << ", model " << dtype_name(w));
      check_adamw(g, w, kOddSizes, 3, dev());
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaKernels, AdamWBatchesManyTensors) {
  std::vector<size_t> sizes;
  for (int i = 0; i < 130; ++i) sizes.push_back(static_cast<size_t>(1 + (i * 37) % 300));
  sizes.push_back(150000);  // several chunks in the middle of a batch
  check_adamw(DType::kBF16, DType::kBF16, sizes, 0, dev());
}

TEST_F(CudaKernels, AdamWSkipsStepWhenFoundInf) {
  std::vector<float> p = {1.0f, 2.0f}, g = {1.0f, 1.0f}, m = {0.5f, 0.5f}, v = {0.25f, 0.25f};
  DeviceBuffer dp = upload(p), dg = upload(g), dm = upload(m), dv = upload(v);
  DeviceBuffer flag = upload(std::vector<float>{1.0f});
  AdamWTensor t{dp.as<float>(), dg.data(), dm.as<float>(), dv.as<float>(), nullptr, 2};
  cuda::adamw_step({&t, 1}, DType::kF32, DType::kF32, AdamWConfig{}, flag.as<float>(), nullptr);
  EXPECT_EQ(download<float>(dp, 2), p);
  EXPECT_EQ(download<float>(dm, 2), m);
  // With the flag cleared the same call updates.
  dev().fill_async(flag.data(), 0, 4, dev().default_stream(0));
  cuda::adamw_step({&t, 1}, DType::kF32, DType::kF32, AdamWConfig{}, flag.as<float>(), nullptr);
  EXPECT_NE(download<float>(dp, 2), p);
}

TEST_F(CudaKernels, UnscaleMatchesReferenceAndFlags) {
  const float inf = std::numeric_limits<float>::infinity();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(t));
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 100.0f);
    std::vector<std::vector<uint8_t>> host;
    std::vector<DeviceBuffer> bufs;
    std::vector<size_t> sizes = {1, 7, 4096, 65537, 131072, 3};
    for (size_t n : sizes) {
      std::vector<float> x(n + 1);
      for (float& f : x) f = nd(rng);
      host.push_back(encode_all(x, t));
      DeviceBuffer b(DeviceType::kCUDA, host.back().size());
      dev().copy(b.data(), host.back().data(), host.back().size());
      bufs.push_back(std::move(b));
    }
    auto run = [&](float inv_scale) {
      std::vector<GradTensor> h, d;
      for (size_t k = 0; k < sizes.size(); ++k) {
        size_t o = k % 2;  // odd tensors start one element in: misaligned
        h.push_back({host[k].data() + o * dtype_size(t), sizes[k]});
        d.push_back({bufs[k].as<uint8_t>() + o * dtype_size(t), sizes[k]});
      }
      float found_ref = 0.0f;
      DeviceBuffer found = upload(std::vector<float>{0.0f});
      unscale_grads_ref(h, t, inv_scale, &found_ref);
      cuda::unscale_grads(d, t, inv_scale, found.as<float>(), nullptr);
      EXPECT_EQ(download<float>(found, 1)[0], found_ref);
      for (size_t k = 0; k < sizes.size(); ++k) {
        std::vector<uint8_t> got = download<uint8_t>(bufs[k], host[k].size());
        EXPECT_TRUE(got == host[k]) << "tensor " << k << " differs from the reference";
      }
      return found_ref;
    };
    EXPECT_EQ(run(1.0f / 64.0f), 0.0f);
    // Poison one element deep inside a multi-chunk tensor.
    size_t at = 70000 * dtype_size(t);
    std::vector<uint8_t> bad = encode_all({inf}, t);
    std::memcpy(host[4].data() + at, bad.data(), bad.size());
    dev().copy(bufs[4].as<uint8_t>() + at, bad.data(), bad.size());
    EXPECT_EQ(run(2.0f), 1.0f);
  }
}

TEST_F(CudaKernels, CastsMatchReferenceBitForBit) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  const size_t n = 100003;
  std::vector<float> src(n);
  for (float& f : src) f = std::bit_cast<float>(bits(rng));  // every class: NaN, inf, subnormal...
  src[0] = 65520.0f;
  src[1] = -0.0f;
  src[2] = 5.9604645e-08f;
  for (DType half : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(half));
    for (size_t offset : {0, 1}) {
      DeviceBuffer dsrc = upload(src);
      DeviceBuffer dhalf(DeviceType::kCUDA, n * 2);
      DeviceBuffer dback(DeviceType::kCUDA, n * 4);
      size_t m = n - offset;
      cuda::cast(dsrc.as<float>() + offset, DType::kF32, dhalf.as<uint16_t>() + offset, half, m, nullptr);
      cuda::cast(dhalf.as<uint16_t>() + offset, half, dback.as<float>() + offset, DType::kF32, m, nullptr);
      std::vector<uint16_t> want_half(m);
      std::vector<float> want_back(m);
      cast_ref(src.data() + offset, DType::kF32, want_half.data(), half, m);
      cast_ref(want_half.data(), half, want_back.data(), DType::kF32, m);
      std::vector<uint16_t> got_half = download<uint16_t>(dhalf, m, offset);
      std::vector<float> got_back = download<float>(dback, m, offset);
      for (size_t i = 0; i < m; ++i) {
        if (std::isnan(src[i + offset])) {
          ASSERT_TRUE(std::isnan(got_back[i])) << i;
          continue;
        }
        ASSERT_EQ(got_half[i], want_half[i]) << "element " << i << " value " << src[i + offset];
        ASSERT_EQ(std::bit_cast<uint32_t>(got_back[i]), std::bit_cast<uint32_t>(want_back[i])) << i;
      }
    }
  }
  // Same type: a copy.
  DeviceBuffer a = upload(src);
  DeviceBuffer b(DeviceType::kCUDA, n * 4);
  cuda::cast(a.data(), DType::kF32, b.data(), DType::kF32, n, nullptr);
  std::vector<float> copy = download<float>(b, n);
  EXPECT_EQ(std::memcmp(copy.data(), src.data(), n * 4), 0);
}

}  // namespace
}  // namespace torus::kernels
