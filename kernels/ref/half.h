// kernels/ref/half.h — scalar conversions between f32 and the two 16-bit
// floating formats, written from the format definitions (IEEE 754 binary16;
// bfloat16 = the upper half of binary32). They are the CPU references the
// CUDA kernels are checked against, so they favour obviousness over speed.
//
// Rounding is to nearest, ties to even. NaN stays NaN (quietened, sign and
// leading payload bits kept); overflow gives infinity; f16 results below the
// normal range are rounded into subnormals.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace torus::kernels::ref {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7fff plus the lowest kept bit rounds the dropped half to nearest,
  // ties to even; a carry out of the mantissa correctly bumps the exponent
  // (up to infinity).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign != 0 ? -v : v;
  }
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to infinity
  if (a < 0x38800000u) {
    // Below 2^-14, the smallest normal: the result is a multiple of 2^-24.
    // Scaling by 2^24 is exact, and rint rounds ties to even (the default
    // rounding mode). 1024 is the smallest normal's encoding, as it must be.
    float scaled = std::bit_cast<float>(a) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::rint(scaled)));
  }
  a += 0xfffu + ((a >> 13) & 1u);  // round the 13 dropped bits, ties to even
  a -= 112u << 23;                 // rebias the exponent from 127 to 15
  return static_cast<uint16_t>(sign | (a >> 13));
}

}  // namespace torus::kernels::ref
