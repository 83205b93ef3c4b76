// float8_e4m3fn weights widened to float32 without a table, in the widest vectors the build has:
// AVX-512F (16 lanes), AVX2 + F16C + FMA (8 lanes), else one lane. fp8_matmul.cpp is written once against
// these `Lanes` types.
//
// The vector trick: an e4m3fn byte b placed as the fp16 bits  sign << 15 | (b & 0x7F) << 7  is the same
// number divided by 2^8 (fp16's exponent bias is 15, e4m3's 7; both have subnormals, and e4m3's largest
// exponent is an ordinary fp16 one), so one vcvtph2ps widens 8 or 16 weights and the 2^8 goes into the
// scale (`kScaleFactor`). e4m3fn has no infinities; its NaN, |b| = 0x7F, would read as 1.875 * 2^-8:
// rows holding one are found by `has_nan` (a cheap pass, checkpoints have none) and handled apart.
#pragma once

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

namespace fp8 {

// One e4m3fn value from its fields (scalar code and vector tails).
inline float e4m3fn_to_float(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80) << 24;
  const uint32_t magnitude = bits & 0x7F;  // exponent (4 bits, bias 7) and mantissa (3 bits)
  uint32_t out;
  if (magnitude == 0x7F) {
    out = sign | 0x7FC00000u;
  } else if (magnitude >= 0x08) {  // normal: rebias the exponent to float32's 127
    out = sign | ((magnitude + (120u << 3)) << 20);
  } else {  // subnormal: mantissa * 2^-6 / 8
    const float value = static_cast<float>(magnitude) * 0x1p-9f;
    return sign ? -value : value;
  }
  float value;
  std::memcpy(&value, &out, sizeof value);
  return value;
}

// Whether any of n weights is e4m3fn's NaN (the compiler vectorizes the loop).
inline bool has_nan(const uint8_t* w, int64_t n) {
  uint8_t found = 0;
#pragma omp simd reduction(| : found)
  for (int64_t i = 0; i < n; ++i) found |= static_cast<uint8_t>((w[i] & 0x7F) == 0x7F);
  return found != 0;
}

#if defined(__AVX2__) && defined(__F16C__)
// u16 lanes holding bytes b -> the fp16 bits of b / 2^8 (NaN patterns excepted: see has_nan).
inline __m128i fp8_to_half(__m128i bytes16) {
  // b << 8 then an arithmetic shift by one: the sign stays in bit 15 and is copied into bit 14, which the
  // mask clears; exponent and mantissa land in bits 13..7.
  const __m128i shifted = _mm_srai_epi16(_mm_slli_epi16(bytes16, 8), 1);
  return _mm_and_si128(shifted, _mm_set1_epi16(static_cast<short>(0xBFFF)));
}
inline __m256i fp8_to_half(__m256i bytes16) {
  const __m256i shifted = _mm256_srai_epi16(_mm256_slli_epi16(bytes16, 8), 1);
  return _mm256_and_si256(shifted, _mm256_set1_epi16(static_cast<short>(0xBFFF)));
}
#endif

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__F16C__)
struct Lanes {
  using V = __m512;
  static constexpr int kWidth = 16;
  static constexpr float kScaleFactor = 256.f;
  static constexpr const char* kName = "avx512";
  static V zero() { return _mm512_setzero_ps(); }
  static V splat(float v) { return _mm512_set1_ps(v); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
  // 16 weights / 2^8
  static V widen(const uint8_t* p) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtph_ps(fp8_to_half(_mm256_cvtepu8_epi16(bytes)));
  }
};
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
struct Lanes {
  using V = __m256;
  static constexpr int kWidth = 8;
  static constexpr float kScaleFactor = 256.f;
  static constexpr const char* kName = "avx2";
  static V zero() { return _mm256_setzero_ps(); }
  static V splat(float v) { return _mm256_set1_ps(v); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) {
    const __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 twos = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
    return _mm_cvtss_f32(_mm_add_ss(twos, _mm_movehdup_ps(twos)));
  }
  // 8 weights / 2^8
  static V widen(const uint8_t* p) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtph_ps(fp8_to_half(_mm_cvtepu8_epi16(bytes)));
  }
};
#else
struct Lanes {
  using V = float;
  static constexpr int kWidth = 1;
  static constexpr float kScaleFactor = 1.f;
  static constexpr const char* kName = "scalar";
  static V zero() { return 0.f; }
  static V splat(float v) { return v; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V mul(V a, V b) { return a * b; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static float sum(V v) { return v; }
  static V widen(const uint8_t* p) { return e4m3fn_to_float(*p); }
};
#endif

// 2 * kWidth weights / kScaleFactor into two vectors. NOTE: with AVX-512BW one 512-bit integer widening serves
// both halves (a quarter fewer instructions per weight at decode, where they bound the kernel).
inline void widen_pair(const uint8_t* p, Lanes::V& low, Lanes::V& high) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX2__) && defined(__F16C__)
  const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i half =
      _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(words, 8), 1), _mm512_set1_epi16(static_cast<short>(0xBFFF)));
  low = _mm512_cvtph_ps(_mm512_castsi512_si256(half));
  high = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(half, 1));
#else
  low = Lanes::widen(p);
  high = Lanes::widen(p + Lanes::kWidth);
#endif
}

}  // namespace fp8
