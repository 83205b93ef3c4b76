// Integer lanes on vec.h's float lanes: the int8/int16 dot products of the quantized matmuls (VNNI where the
// build has it), bytes widened and rounded to int32 lanes, and the exact int32 -> float32 of two-part sums.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "vec.h"

namespace vec {

// ---- integer lanes (AVX2 up): the dot products of the quantized matmuls -------------------------------------

#if defined(__AVX2__)
// Int16s: 2 * kLanes int16 lanes, Int32s: kLanes int32 lanes, each in one Vec-sized register.
using Int16s = int16_t __attribute__((vector_size(sizeof(Vec))));
using Int32s = int32_t __attribute__((vector_size(sizeof(Vec))));

// 2 * kLanes bytes, signed or unsigned, widened to int16 lanes.
template <typename Byte>
inline Int16s widen_bytes(const Byte* p) {
  static_assert(sizeof(Byte) == 1, "bytes: int8_t or uint8_t");
  constexpr bool kSigned = std::is_signed_v<Byte>;
#if defined(PAGEDSERVE_VEC_AVX512)
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return (Int16s)(kSigned ? _mm512_cvtepi8_epi16(bytes) : _mm512_cvtepu8_epi16(bytes));
#else
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (Int16s)(kSigned ? _mm256_cvtepi8_epi16(bytes) : _mm256_cvtepu8_epi16(bytes));
#endif
}


// acc + sum over lane pairs of a[i] * b[i] (int16) -> eight int32 (AVX-VNNI's dpwssd where the build has it).
inline __m256i dot_pairs(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// The same in Vec-sized registers.
inline Int32s dot_pairs(Int32s acc, Int16s a, Int16s b) {
#if defined(PAGEDSERVE_VEC_AVX512) && defined(__AVX512VNNI__)
  return (Int32s)_mm512_dpwssd_epi32((__m512i)acc, (__m512i)a, (__m512i)b);
#elif defined(PAGEDSERVE_VEC_AVX512)
  return acc + (Int32s)_mm512_madd_epi16((__m512i)a, (__m512i)b);
#else
  return (Int32s)dot_pairs((__m256i)acc, (__m256i)a, (__m256i)b);
#endif
}

// Sums over groups of four of u[i] * s[i] (u unsigned, s signed bytes) -> eight int32.
inline __m256i dot_groups(__m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else  // NOTE: no int16 saturation where |u| <= 128 and |s| <= 127: pair sums up to 32512.
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
#endif

// ---- byte quads: every build ---------------------------------------------------------------------------------
// Bytes: 4 * kLanes bytes in one Vec-sized register, four per int32 lane (Quads: the same bits as int32 lanes).
using Bytes = uint8_t __attribute__((vector_size(sizeof(Vec))));
using Quads = int32_t __attribute__((vector_size(sizeof(Vec))));

// acc + per int32 lane the sum of its four u[i] * s[i] (u unsigned bytes up to 63, s signed bytes in
// [-127, 127]): one AVX-512 VNNI or AVX-VNNI `vpdpbusd`, else maddubs + madd (no int16 saturation at these
// bounds: pair sums up to 16002), else plain C++.
inline Quads dot_quads(Quads acc, Bytes u, Bytes s) {
#if defined(PAGEDSERVE_VEC_AVX512) && defined(__AVX512VNNI__)
  return (Quads)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)u, (__m512i)s);
#elif defined(PAGEDSERVE_VEC_AVX512)
  return acc + (Quads)_mm512_madd_epi16(_mm512_maddubs_epi16((__m512i)u, (__m512i)s), _mm512_set1_epi16(1));
#elif defined(__AVXVNNI__)
  return (Quads)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)u, (__m256i)s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return (Quads)_mm256_dpbusd_epi32((__m256i)acc, (__m256i)u, (__m256i)s);
#elif defined(__AVX2__)
  return acc + (Quads)_mm256_madd_epi16(_mm256_maddubs_epi16((__m256i)u, (__m256i)s), _mm256_set1_epi16(1));
#else
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i)
      acc[lane] += static_cast<int32_t>(u[4 * lane + i]) * static_cast<int8_t>(s[4 * lane + i]);
  return acc;
#endif
}

// kLanes bytes, signed or unsigned, widened to int32 lanes.
template <typename Byte>
inline Quads bytes_to_quads(const Byte* p) {
  static_assert(sizeof(Byte) == 1, "bytes: int8_t or uint8_t");
  constexpr bool kSigned = std::is_signed_v<Byte>;
#if defined(PAGEDSERVE_VEC_AVX512)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (Quads)(kSigned ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes));
#elif defined(__AVX2__)
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return (Quads)(kSigned ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
#else
  Quads v;
  for (int i = 0; i < kLanes; ++i) v[i] = p[i];
  return v;
#endif
}

// int32 lanes to float32 (Quads is Int32s where the build has AVX2).
inline Vec to_floats(Quads v) { return __builtin_convertvector(v, Vec); }

// kLanes bytes, signed or unsigned, widened to float32 lanes. NOTE: through bytes_to_quads' intrinsics: GCC 12
// turns __builtin_convertvector of bytes into one scalar conversion per lane (~60 instructions).
template <typename Byte>
inline Vec bytes_to_floats(const Byte* p) {
  return to_floats(bytes_to_quads(p));
}

// float32 lanes rounded to int32, ties to even (as std::nearbyint in the default rounding mode).
inline Quads round_to_quads(Vec v) {
#if defined(PAGEDSERVE_VEC_AVX512)
  return (Quads)_mm512_cvtps_epi32(v);
#elif defined(__AVX2__)
  return (Quads)_mm256_cvtps_epi32(v);
#else
  Quads q;
  for (int i = 0; i < kLanes; ++i) q[i] = static_cast<int32_t>(std::nearbyint(v[i]));
  return q;
#endif
}

// The low byte of each int32 lane, stored to p[0..kLanes).
inline void store_low_bytes(int8_t* p, Quads v) {
#if defined(PAGEDSERVE_VEC_AVX512)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8((__m512i)v));
#else
  for (int i = 0; i < kLanes; ++i) p[i] = static_cast<int8_t>(v[i]);
#endif
}

inline int32_t sum(Quads v) {
#if defined(PAGEDSERVE_VEC_AVX512)
  return _mm512_reduce_add_epi32((__m512i)v);
#else
  int32_t total = 0;
  for (int i = 0; i < kLanes; ++i) total += v[i];
  return total;
#endif
}

// 128 high + low per lane to float32, rounded once from the exact integer (up to 2^38 here: exact in
// float64), so any two ways of splitting the same integer give the same float.
inline Vec exact_floats(Quads high, Quads low) {
  using Doubles = double __attribute__((vector_size(2 * sizeof(Vec))));
  const Doubles exact = __builtin_convertvector(high, Doubles) * 128.0 + __builtin_convertvector(low, Doubles);
  return __builtin_convertvector(exact, Vec);
}

}  // namespace vec
