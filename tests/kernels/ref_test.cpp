// The CPU references of the CUDA kernels (kernels/ref/), tested on their own
// against closed forms and independent double-precision or compiler-provided
// arithmetic, so that the GPU tests compare the kernels with something known
// to be right. Runs in every build.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/ref/adamw_ref.h"
#include "kernels/ref/cast_ref.h"
#include "kernels/ref/half.h"
#include "kernels/ref/unscale_ref.h"
#include "torus/core/error.h"

namespace torus::kernels {
namespace {

using ref::bf16_to_f32;
using ref::f16_to_f32;
using ref::f32_to_bf16;
using ref::f32_to_f16;

// Floats to probe conversions with: a stride through all bit patterns plus
// the boundaries that matter for 16-bit formats.
std::vector<float> probe_floats() {
  std::vector<float> v;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 65521) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  for (float f : {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 6.1035156e-05f,
                  5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 1e-10f, 3.3895314e38f, 3.4028235e38f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min(), 1.00390625f, 1.005859375f}) {
    v.push_back(f);
  }
  return v;
}

TEST(HalfRef, F16RoundTripsEveryEncoding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (nan) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << h;
    } else {
      ASSERT_EQ(f32_to_f16(f), h) << "encoding " << h << " value " << f;
    }
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
}

// Against the compiler's _Float16 conversion (libgcc, round to nearest even).
TEST(HalfRef, F32ToF16MatchesTheCompiler) {
  for (float f : probe_floats()) {
    uint16_t mine = f32_to_f16(f);
    _Float16 theirs = static_cast<_Float16>(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(f16_to_f32(mine)));
      continue;
    }
    ASSERT_EQ(mine, std::bit_cast<uint16_t>(theirs)) << "f = " << f << " bits " << std::bit_cast<uint32_t>(f);
  }
}

TEST(HalfRef, Bf16RoundTripsEveryEncoding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      ASSERT_EQ(f32_to_bf16(f), h) << h;
    }
  }
}

// Independent check: the result is the nearer of the two bf16 values around
// f (computed in double), ties going to the even encoding.
TEST(HalfRef, F32ToBf16IsNearestEven) {
  for (float f : probe_floats()) {
    if (std::isnan(f) || std::isinf(f)) continue;
    uint32_t u = std::bit_cast<uint32_t>(f);
    uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation: toward zero
    uint16_t hi = static_cast<uint16_t>(lo + 1);   // next away from zero (may be inf)
    double dlo = std::fabs(static_cast<double>(f) - bf16_to_f32(lo));
    // Past the largest finite value the "next" value is 2^128 (rounding to it
    // means overflowing to infinity).
    double vhi = (hi & 0x7fff) == 0x7f80 ? std::copysign(std::ldexp(1.0, 128), f) : bf16_to_f32(hi);
    double dhi = std::fabs(static_cast<double>(f) - vhi);
    uint16_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) == 0 ? lo : hi);
    if ((u & 0xffff) == 0) want = lo;  // exact
    ASSERT_EQ(f32_to_bf16(f), want) << "f = " << f;
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(3.14159265f)), 3.140625f);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80) << "tie to even (down)";
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82) << "tie to even (up)";
}

TEST(CastRef, PairsAndValues) {
  EXPECT_TRUE(cast_supported(DType::kF32, DType::kBF16));
  EXPECT_TRUE(cast_supported(DType::kF16, DType::kF32));
  EXPECT_TRUE(cast_supported(DType::kBF16, DType::kBF16));
  EXPECT_FALSE(cast_supported(DType::kBF16, DType::kF16));
  EXPECT_FALSE(cast_supported(DType::kF32, DType::kI32));
  float in[4] = {1.0f, -2.5f, 70000.0f, std::numeric_limits<float>::quiet_NaN()};
  uint16_t h[4];
  float back[4];
  cast_ref(in, DType::kF32, h, DType::kF16, 4);
  cast_ref(h, DType::kF16, back, DType::kF32, 4);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_TRUE(std::isinf(back[2])) << "overflow to infinity";
  EXPECT_TRUE(std::isnan(back[3]));
  cast_ref(in, DType::kF32, h, DType::kBF16, 4);
  cast_ref(h, DType::kBF16, back, DType::kF32, 4);
  EXPECT_EQ(back[2], 70144.0f);  // 70000 to 8 significant bits
  EXPECT_THROW(cast_ref(in, DType::kF32, h, DType::kU8, 4), InvalidArgument);
}

TEST(UnscaleRef, ScalesAndFlagsNonFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a = {1.0f, 2.0f, -4.0f};
  std::vector<float> b = {8.0f, inf};
  std::vector<GradTensor> grads = {{a.data(), a.size()}, {b.data(), b.size()}};
  float found = 0.0f;
  unscale_grads_ref(std::span<const GradTensor>(grads.data(), 1), DType::kF32, 0.5f, &found);
  EXPECT_EQ(found, 0.0f);
  EXPECT_EQ(a, (std::vector<float>{0.5f, 1.0f, -2.0f}));
  unscale_grads_ref(grads, DType::kF32, 0.25f, &found);
  EXPECT_EQ(found, 1.0f);
  EXPECT_EQ(b[0], 2.0f);
  EXPECT_TRUE(std::isinf(b[1]));
  // The flag is never cleared by a later clean call.
  unscale_grads_ref(std::span<const GradTensor>(grads.data(), 1), DType::kF32, 1.0f, &found);
  EXPECT_EQ(found, 1.0f);
}

TEST(UnscaleRef, HalfTypesDetectNaN) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    auto enc = [&](float f) { return t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f); };
    auto dec = [&](uint16_t h) { return t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h); };
    std::vector<uint16_t> g = {enc(1024.0f), enc(-3.0f), enc(0.0f)};
    GradTensor gt{g.data(), g.size()};
    float found = 0.0f;
    unscale_grads_ref({&gt, 1}, t, 1.0f / 1024.0f, &found);
    EXPECT_EQ(found, 0.0f);
    EXPECT_EQ(dec(g[0]), 1.0f);
    EXPECT_EQ(dec(g[1]), -3.0f / 1024.0f);
    g[2] = enc(std::numeric_limits<float>::quiet_NaN());
    unscale_grads_ref({&gt, 1}, t, 2.0f, &found);
    EXPECT_EQ(found, 1.0f);
  }
  float found = 0;
  EXPECT_THROW(unscale_grads_ref({}, DType::kI32, 1.0f, &found), InvalidArgument);
}

// Step 1 with gradient g has the closed form
//   p1 = p0 (1 - lr wd) - lr g / (|g| + eps)
// because m̂ = g and v̂ = g^2 after bias correction.
TEST(AdamWRef, FirstStepClosedForm) {
  AdamWConfig c;
  c.lr = 0.01f;
  c.weight_decay = 0.1f;
  c.eps = 1e-6f;
  std::vector<float> p = {1.0f, -2.0f, 0.5f, 3.0f};
  std::vector<float> g = {0.5f, -0.25f, 2.0f, 1e-3f};
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  std::vector<uint16_t> w(4);
  std::vector<float> p0 = p;
  AdamWTensor t{p.data(), g.data(), m.data(), v.data(), w.data(), 4};
  adamw_step_ref({&t, 1}, DType::kF32, DType::kBF16, c);
  for (int i = 0; i < 4; ++i) {
    double want = p0[i] * (1.0 - 0.01 * 0.1) - 0.01 * g[i] / (std::fabs(g[i]) + 1e-6);
    EXPECT_NEAR(p[i], want, 1e-6 * std::fabs(want) + 1e-7) << i;
    // 1 - beta in the betas' own (f32) precision: 1 - 0.999f is not 0.001.
    double one_minus_b1 = 1.0 - static_cast<double>(c.beta1);
    double one_minus_b2 = 1.0 - static_cast<double>(c.beta2);
    EXPECT_NEAR(m[i], one_minus_b1 * g[i], 1e-6 * std::fabs(one_minus_b1 * g[i])) << i;
    EXPECT_NEAR(v[i], one_minus_b2 * g[i] * g[i], 1e-6 * one_minus_b2 * g[i] * g[i]) << i;
    EXPECT_EQ(w[i], f32_to_bf16(p[i])) << "model copy is the rounded master weight";
  }
}

// Ten steps against an independent double-precision implementation, with a
// loss scale and bf16 gradients.
TEST(AdamWRef, MatchesDoublePrecisionOverSteps) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t n = 1000;
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> pd(n), md(n, 0.0), vd(n, 0.0);
  for (size_t i = 0; i < n; ++i) pd[i] = p[i] = dist(rng);
  AdamWConfig c;
  c.lr = 3e-3f;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.eps = 1e-8f;
  c.weight_decay = 0.05f;
  c.inv_grad_scale = 1.0f / 256.0f;
  for (int step = 1; step <= 10; ++step) {
    std::vector<uint16_t> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = f32_to_bf16(dist(rng) * 256.0f);
    c.step = step;
    AdamWTensor t{p.data(), g.data(), m.data(), v.data(), nullptr, n};
    adamw_step_ref({&t, 1}, DType::kBF16, DType::kF32, c);
    double b1 = c.beta1, b2 = c.beta2;
    double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (size_t i = 0; i < n; ++i) {
      double gi = static_cast<double>(bf16_to_f32(g[i])) / 256.0;
      pd[i] *= 1 - static_cast<double>(c.lr) * c.weight_decay;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      pd[i] -= c.lr / bc1 * md[i] / (std::sqrt(vd[i]) / std::sqrt(bc2) + c.eps);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(p[i], pd[i], 1e-5 * std::fabs(pd[i]) + 1e-6) << i;
    ASSERT_NEAR(m[i], md[i], 1e-5 * std::fabs(md[i]) + 1e-7) << i;
    ASSERT_NEAR(v[i], vd[i], 1e-5 * std::fabs(vd[i]) + 1e-9) << i;
  }
}

TEST(AdamWRef, FoundInfSkipsTheStep) {
  std::vector<float> p = {1.0f}, g = {1.0f}, m = {0.5f}, v = {0.25f};
  AdamWTensor t{p.data(), g.data(), m.data(), v.data(), nullptr, 1};
  float found = 1.0f;
  adamw_step_ref({&t, 1}, DType::kF32, DType::kF32, AdamWConfig{}, &found);
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(m[0], 0.5f);
  EXPECT_EQ(v[0], 0.25f);
}

TEST(AdamWRef, RejectsBadArguments) {
  std::vector<float> p = {1.0f}, g = {1.0f}, m = {0.0f}, v = {0.0f};
  std::vector<uint16_t> w(1);
  AdamWTensor with{p.data(), g.data(), m.data(), v.data(), w.data(), 1};
  AdamWTensor without{p.data(), g.data(), m.data(), v.data(), nullptr, 1};
  AdamWConfig c;
  c.step = 0;
  EXPECT_THROW(adamw_step_ref({&without, 1}, DType::kF32, DType::kF32, c), InvalidArgument);
  AdamWTensor mixed[2] = {with, without};
  EXPECT_THROW(adamw_step_ref(mixed, DType::kF32, DType::kBF16, AdamWConfig{}), InvalidArgument);
  EXPECT_THROW(adamw_step_ref({&with, 1}, DType::kF32, DType::kF32, AdamWConfig{}), InvalidArgument);
  EXPECT_THROW(adamw_step_ref({&without, 1}, DType::kI32, DType::kF32, AdamWConfig{}), InvalidArgument);
  AdamWTensor null_grad{p.data(), nullptr, m.data(), v.data(), nullptr, 1};
  EXPECT_THROW(adamw_step_ref({&null_grad, 1}, DType::kF32, DType::kF32, AdamWConfig{}), InvalidArgument);
}

}  // namespace
}  // namespace torus::kernels
