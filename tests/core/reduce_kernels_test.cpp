// The host reduction kernels against plain reference loops (double precision
// for floats, exact for integers), for every dtype and reduce op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "torus/comm/types.h"  // comm::ReduceOp and its names

namespace torus::kernels {
namespace {

using comm::ReduceOp;

// Reference bf16 rounding: pick the nearer of the two neighbouring bf16
// values (by exact double arithmetic), ties to the even one.
uint16_t ref_bf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint16_t lo = static_cast<uint16_t>(bits >> 16);
  uint16_t hi = static_cast<uint16_t>(lo + 1);
  double dl = std::fabs(double(bf16_to_float(lo)) - f), dh = std::fabs(double(bf16_to_float(hi)) - f);
  if ((bits & 0xffff) == 0) return lo;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(ReduceKernels, Bf16RoundingMatchesReference) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isinf(f) || std::isnan(f)) continue;
    if (std::fabs(f) > 3.0e38f) continue;  // rounding up would overflow; covered by the inf check below
    ASSERT_EQ(float_to_bf16(f), ref_bf16(f)) << "bits " << b;
  }
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(INFINITY))));
  // Vector path equals the scalar path.
  std::vector<float> in(1031);
  for (size_t i = 0; i < in.size(); ++i) in[i] = std::ldexp(float(i) * 1.37f - 400.f, int(i % 13) - 6);
  std::vector<uint16_t> out(in.size());
  f32_to_half(in.data(), out.data(), in.size(), DType::kBF16);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], float_to_bf16(in[i]));
  std::vector<float> back(in.size());
  half_to_f32(out.data(), back.data(), in.size(), DType::kBF16);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(back[i], bf16_to_float(out[i]));
}

TEST(ReduceKernels, F16ConversionsRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f), h) << "f16 bits " << h;
  }
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(float_to_f16(65504.f), 0x7bff);
}

double load(const void* p, size_t i, DType t) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kU8: return static_cast<const uint8_t*>(p)[i];
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

void store(void* p, size_t i, DType t, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kF64: static_cast<double*>(p)[i] = v; break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = float_to_f16(static_cast<float>(v)); break;
  }
}

TEST(ReduceKernels, EveryDtypeAndOpMatchesReference) {
  for (DType t : kAllDTypes) {
    for (ReduceOp op : comm::kAllReduceOps) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1031}}) {
        const size_t es = dtype_size(t);
        std::vector<uint8_t> a(n * es + 1), b(n * es + 1), dst(n * es + 1);
        for (size_t i = 0; i < n; ++i) {
          // Small integers: exact in every dtype, products too (<= 12*12).
          store(a.data(), i, t, double((i * 7) % 13));
          store(b.data(), i, t, double((i * 5 + 3) % 11));
        }
        reduce_into(dst.data(), a.data(), b.data(), n, t, op);
        for (size_t i = 0; i < n; ++i) {
          double x = load(a.data(), i, t), y = load(b.data(), i, t), expect = 0;
          switch (op) {
            case ReduceOp::kSum:
            case ReduceOp::kAvg: expect = x + y; break;
            case ReduceOp::kProd: expect = x * y; break;
            case ReduceOp::kMax: expect = std::max(x, y); break;
            case ReduceOp::kMin: expect = std::min(x, y); break;
          }
          ASSERT_EQ(load(dst.data(), i, t), expect) << dtype_name(t) << " " << comm::reduce_op_name(op) << " i=" << i;
        }
        if (n > 0) {
          // divide_inplace: truncating for integers, rounding for floats.
          std::vector<uint8_t> c = dst;
          divide_inplace(c.data(), n, t, 3);
          for (size_t i = 0; i < n; ++i) {
            double v = load(dst.data(), i, t);
            double expect = dtype_is_floating(t) ? v / 3.0 : std::trunc(v / 3.0);
            double tol = t == DType::kBF16 ? 1e-2 * std::fabs(expect) : t == DType::kF16 ? 1e-3 * std::fabs(expect)
                         : t == DType::kF32                          ? 1e-6 * std::fabs(expect)
                                                                     : 0.0;
            ASSERT_NEAR(load(c.data(), i, t), expect, tol + 1e-300);
          }
        }
      }
    }
  }
}

TEST(ReduceKernels, HalfAccumulationInF32RoundsOnce) {
  // 256 + 1 + 1 ... in bf16 stays 256 when rounded per step; in f32 it
  // accumulates exactly and rounds once at the end.
  const size_t n = 5;
  std::vector<float> acc(n, 256.f);
  std::vector<uint16_t> one(n, float_to_bf16(1.f));
  for (int k = 0; k < 4; ++k) reduce_half_into_f32(acc.data(), one.data(), n, DType::kBF16, ReduceOp::kSum);
  std::vector<uint16_t> out(n);
  f32_to_half(acc.data(), out.data(), n, DType::kBF16);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(bf16_to_float(out[i]), 260.f);
  EXPECT_STRNE(reduce_isa(), "");
}

}  // namespace
}  // namespace torus::kernels
