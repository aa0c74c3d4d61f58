// Non-temporal copy (stream_copy.h).
#include "comm/ofi/stream_copy.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace torus::comm::ofi {
namespace {

// Copies the unaligned head with memcpy so that dst is `align`-aligned;
// returns the bytes it took.
size_t head_to_align(char* dst, const char* src, size_t n, size_t align) {
  size_t mis = reinterpret_cast<uintptr_t>(dst) & (align - 1);
  size_t head = mis == 0 ? 0 : align - mis;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  return head;
}

__attribute__((target("avx512f"))) void copy_avx512(char* dst, const char* src, size_t n) {
  size_t i = head_to_align(dst, src, n, 64);
  for (; i + 256 <= n; i += 256) {
    __m512i a = _mm512_loadu_si512(src + i);
    __m512i b = _mm512_loadu_si512(src + i + 64);
    __m512i c = _mm512_loadu_si512(src + i + 128);
    __m512i d = _mm512_loadu_si512(src + i + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 64), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 128), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 192), d);
  }
  for (; i + 64 <= n; i += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
  }
  std::memcpy(dst + i, src + i, n - i);
}

__attribute__((target("avx2"))) void copy_avx2(char* dst, const char* src, size_t n) {
  size_t i = head_to_align(dst, src, n, 32);
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  std::memcpy(dst + i, src + i, n - i);
}

using CopyFn = void (*)(char*, const char*, size_t);

CopyFn pick() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return copy_avx512;
  if (__builtin_cpu_supports("avx2")) return copy_avx2;
  return [](char* d, const char* s, size_t n) { std::memcpy(d, s, n); };
}

void copy_fn(char* dst, const char* src, size_t n) {
  static const CopyFn fn = pick();
  fn(dst, src, n);
}

}  // namespace

void stream_copy_unfenced(void* dst, const void* src, size_t n) {
  copy_fn(static_cast<char*>(dst), static_cast<const char*>(src), n);
}

void stream_copy(void* dst, const void* src, size_t n) {
  copy_fn(static_cast<char*>(dst), static_cast<const char*>(src), n);
  _mm_sfence();
}

}  // namespace torus::comm::ofi
