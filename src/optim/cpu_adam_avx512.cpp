// The AVX-512 path of the CPU Adam kernel (compiled with -mavx512f
// -mavx512bw -mavx512vl -ffp-contract=off; called only when the CPU has them).
// 16 elements per vector, unaligned loads and stores, the tail one element
// at a time through the scalar code: the same operations in the same order
// (Note [CPU Adam order]), so every element is bit-identical to the scalar
// path.
#include <immintrin.h>

#include "cpu_adam_math.h"

namespace torus::optim::cpu::detail {
namespace {

template <Dtype G>
inline __m512 load_grad16(const void* g, int64_t i) {
  if constexpr (G == Dtype::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(g) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(g) + i));
    if constexpr (G == Dtype::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

template <Dtype O>
inline void store_out16(void* out, int64_t i, __m512 p) {
  if constexpr (O == Dtype::kF32) {
    _mm512_storeu_ps(static_cast<float*>(out) + i, p);
  } else {
    auto* dst = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i);
    if constexpr (O == Dtype::kBF16) {
      // float_to_bf16 on 16 lanes: u + 0x7FFF + ((u >> 16) & 1), >> 16; NaN -> 0x7FC0.
      const __m512i u = _mm512_castps_si512(p);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
      r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
      _mm256_storeu_si256(dst, _mm512_cvtepi32_epi16(r));
    } else {
      _mm256_storeu_si256(dst, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
}

template <Dtype G, Dtype O, bool kOut, bool kDecoupled>
void run(const AdamConsts& c, const AdamSlice& s, int64_t begin, int64_t end) {
  const __m512 b1 = _mm512_set1_ps(c.b1), omb1 = _mm512_set1_ps(c.omb1);
  const __m512 b2 = _mm512_set1_ps(c.b2), omb2 = _mm512_set1_ps(c.omb2);
  const __m512 eps = _mm512_set1_ps(c.eps), wd = _mm512_set1_ps(c.wd), decay = _mm512_set1_ps(c.decay);
  const __m512 step_size = _mm512_set1_ps(c.step_size), rbc2 = _mm512_set1_ps(c.rbc2);
  const __m512 gs = _mm512_set1_ps(c.grad_scale);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 g = _mm512_mul_ps(load_grad16<G>(s.grad, i), gs);
    __m512 p = _mm512_loadu_ps(s.param + i);
    if (c.decay_on) {
      if constexpr (kDecoupled) {
        p = _mm512_mul_ps(p, decay);
      } else {
        g = _mm512_add_ps(g, _mm512_mul_ps(p, wd));
      }
    }
    const __m512 m = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(s.exp_avg + i), b1), _mm512_mul_ps(g, omb1));
    const __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(s.exp_avg_sq + i), b2),
                                   _mm512_mul_ps(_mm512_mul_ps(g, g), omb2));
    const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(v), rbc2), eps);
    p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(step_size, m), denom));
    _mm512_storeu_ps(s.exp_avg + i, m);
    _mm512_storeu_ps(s.exp_avg_sq + i, v);
    _mm512_storeu_ps(s.param + i, p);
    if constexpr (kOut) store_out16<O>(s.param_out, i, p);
  }
  adam_elements<G, O, kOut, kDecoupled>(c, s, i, end);
}

}  // namespace

void adam_range_avx512(const AdamConsts& c, const AdamSlice& s, int64_t begin, int64_t end) {
  dispatch(c, s, [&]<Dtype G, Dtype O, bool kOut, bool kDecoupled>() {
    run<G, O, kOut, kDecoupled>(c, s, begin, end);
  });
}

}  // namespace torus::optim::cpu::detail
