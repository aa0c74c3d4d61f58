// The per-element CPU Adam update (Note [CPU Adam order] in
// torus/optim/cpu_adam_kernel.h) shared by the ISA translation units.
//
// Every TU that includes this is compiled with -ffp-contract=off (see
// sources.cmake): a fused multiply-add would round differently from the
// separate multiply and add that the contract fixes. The helpers live in an
// anonymous namespace on purpose: each TU is compiled for its own ISA
// (-mavx2, -mavx512f...), and an inline function with external linkage
// would let the linker keep the AVX-512 copy for the scalar path too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "torus/optim/cpu_adam_kernel.h"

namespace torus::optim::cpu::detail {

// The constants of one update, each rounded once from double.
struct AdamConsts {
  float b1, omb1, b2, omb2, eps, wd, decay, step_size, rbc2, grad_scale;
  bool decoupled;  // AdamW
  bool decay_on;   // weight decay != 0 (skipped entirely otherwise, as torch does)
};

// Updates elements [begin, end) of `s`; one per ISA, each in its own TU.
void adam_range_scalar(const AdamConsts& c, const AdamSlice& s, int64_t begin, int64_t end);
void adam_range_avx2(const AdamConsts& c, const AdamSlice& s, int64_t begin, int64_t end);
void adam_range_avx512(const AdamConsts& c, const AdamSlice& s, int64_t begin, int64_t end);

namespace {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_to_float(uint16_t h) {
  return float_of(static_cast<uint32_t>(h) << 16);
}
// Round to nearest even; NaN becomes the canonical quiet NaN 0x7FC0 (as c10::BFloat16).
inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t u = bits_of(f);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// IEEE half <-> float without F16C (the FP16 library's bit-exact method,
// which c10::Half also uses): exact widening, round-to-nearest-even narrowing.
inline float f16_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = float_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = float_of((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result = sign | (two_w < (1u << 27) ? bits_of(denormalized) : bits_of(normalized));
  return float_of(result);
}
inline uint16_t float_to_f16(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = bits_of(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_of((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bits_of(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

template <Dtype G>
inline float load_grad(const void* g, int64_t i) {
  if constexpr (G == Dtype::kF32) {
    return static_cast<const float*>(g)[i];
  } else if constexpr (G == Dtype::kBF16) {
    return bf16_to_float(static_cast<const uint16_t*>(g)[i]);
  } else {
    return f16_to_float(static_cast<const uint16_t*>(g)[i]);
  }
}

template <Dtype O>
inline void store_out(void* out, int64_t i, float p) {
  if constexpr (O == Dtype::kF32) {
    static_cast<float*>(out)[i] = p;
  } else if constexpr (O == Dtype::kBF16) {
    static_cast<uint16_t*>(out)[i] = float_to_bf16(p);
  } else {
    static_cast<uint16_t*>(out)[i] = float_to_f16(p);
  }
}

// The contract's element update, one element at a time: the scalar path and
// the tails of the vector paths.
template <Dtype G, Dtype O, bool kOut, bool kDecoupled>
inline void adam_elements(const AdamConsts& c, const AdamSlice& s, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float g = load_grad<G>(s.grad, i) * c.grad_scale;
    float p = s.param[i];
    if (c.decay_on) {
      if constexpr (kDecoupled) {
        p = p * c.decay;
      } else {
        g = g + p * c.wd;
      }
    }
    const float m = s.exp_avg[i] * c.b1 + g * c.omb1;
    const float v = s.exp_avg_sq[i] * c.b2 + (g * g) * c.omb2;
    p = p - (c.step_size * m) / (std::sqrt(v) * c.rbc2 + c.eps);
    s.exp_avg[i] = m;
    s.exp_avg_sq[i] = v;
    s.param[i] = p;
    if constexpr (kOut) store_out<O>(s.param_out, i, p);
  }
}

// Calls fn.template operator()<G, O, kOut, kDecoupled>() for the slice's
// gradient dtype, output dtype (O is unused when kOut is false) and mode.
template <Dtype G, Dtype O, bool kOut, class Fn>
inline void with_mode(const AdamConsts& c, Fn& fn) {
  if (c.decoupled) {
    fn.template operator()<G, O, kOut, true>();
  } else {
    fn.template operator()<G, O, kOut, false>();
  }
}

template <Dtype G, class Fn>
inline void with_out(const AdamConsts& c, const AdamSlice& s, Fn& fn) {
  if (s.param_out == nullptr) return with_mode<G, Dtype::kF32, false>(c, fn);
  switch (s.out_dtype) {
    case Dtype::kF32:
      return with_mode<G, Dtype::kF32, true>(c, fn);
    case Dtype::kBF16:
      return with_mode<G, Dtype::kBF16, true>(c, fn);
    case Dtype::kF16:
      return with_mode<G, Dtype::kF16, true>(c, fn);
  }
}

template <class Fn>
inline void dispatch(const AdamConsts& c, const AdamSlice& s, Fn&& fn) {
  switch (s.grad_dtype) {
    case Dtype::kF32:
      return with_out<Dtype::kF32>(c, s, fn);
    case Dtype::kBF16:
      return with_out<Dtype::kBF16>(c, s, fn);
    case Dtype::kF16:
      return with_out<Dtype::kF16>(c, s, fn);
  }
}

}  // namespace
}  // namespace torus::optim::cpu::detail
