// The AVX2 path of the CPU Adam kernel (compiled with -mavx2 -mfma -mf16c
// -ffp-contract=off; called only when the CPU has them). 8 elements per
// vector, unaligned loads and stores, the tail through the scalar code: the
// same operations in the same order (Note [CPU Adam order]), so every element
// is bit-identical to the scalar path.
#include <immintrin.h>

#include "cpu_adam_math.h"

namespace torus::optim::cpu::detail {
namespace {

template <Dtype G>
inline __m256 load_grad8(const void* g, int64_t i) {
  if constexpr (G == Dtype::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(g) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(g) + i));
    if constexpr (G == Dtype::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

template <Dtype O>
inline void store_out8(void* out, int64_t i, __m256 p) {
  if constexpr (O == Dtype::kF32) {
    _mm256_storeu_ps(static_cast<float*>(out) + i, p);
  } else {
    auto* dst = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i);
    if constexpr (O == Dtype::kBF16) {
      // float_to_bf16 on 8 lanes: u + 0x7FFF + ((u >> 16) & 1), >> 16; NaN -> 0x7FC0.
      const __m256i u = _mm256_castps_si256(p);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
      const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
      r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
      // Every lane is <= 0xFFFF, so the saturating pack only narrows.
      _mm_storeu_si128(dst, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    } else {
      _mm_storeu_si128(dst, _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
}

template <Dtype G, Dtype O, bool kOut, bool kDecoupled>
void run(const AdamConsts& c, const AdamSlice& s, int64_t begin, int64_t end) {
  const __m256 b1 = _mm256_set1_ps(c.b1), omb1 = _mm256_set1_ps(c.omb1);
  const __m256 b2 = _mm256_set1_ps(c.b2), omb2 = _mm256_set1_ps(c.omb2);
  const __m256 eps = _mm256_set1_ps(c.eps), wd = _mm256_set1_ps(c.wd), decay = _mm256_set1_ps(c.decay);
  const __m256 step_size = _mm256_set1_ps(c.step_size), rbc2 = _mm256_set1_ps(c.rbc2);
  const __m256 gs = _mm256_set1_ps(c.grad_scale);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 g = _mm256_mul_ps(load_grad8<G>(s.grad, i), gs);
    __m256 p = _mm256_loadu_ps(s.param + i);
    if (c.decay_on) {
      if constexpr (kDecoupled) {
        p = _mm256_mul_ps(p, decay);
      } else {
        g = _mm256_add_ps(g, _mm256_mul_ps(p, wd));
      }
    }
    const __m256 m = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s.exp_avg + i), b1), _mm256_mul_ps(g, omb1));
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s.exp_avg_sq + i), b2),
                                   _mm256_mul_ps(_mm256_mul_ps(g, g), omb2));
    const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), rbc2), eps);
    p = _mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(step_size, m), denom));
    _mm256_storeu_ps(s.exp_avg + i, m);
    _mm256_storeu_ps(s.exp_avg_sq + i, v);
    _mm256_storeu_ps(s.param + i, p);
    if constexpr (kOut) store_out8<O>(s.param_out, i, p);
  }
  adam_elements<G, O, kOut, kDecoupled>(c, s, i, end);
}

}  // namespace

void adam_range_avx2(const AdamConsts& c, const AdamSlice& s, int64_t begin, int64_t end) {
  dispatch(c, s, [&]<Dtype G, Dtype O, bool kOut, bool kDecoupled>() {
    run<G, O, kOut, kDecoupled>(c, s, begin, end);
  });
}

}  // namespace torus::optim::cpu::detail
