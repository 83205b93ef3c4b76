// The fp8 formats (e4m3fn, e5m2) read and written as torch reads and writes them: one codec (scalar encode
// and decode) and the vector widening through fp16, on vec.h's float lanes.
#pragma once

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "vec.h"

namespace vec {

// ---- fp8 ----------------------------------------------------------------------------------------------------

// One byte of an fp8 format (the storage of an fp8 KV cache or checkpoint), the format in the type.
//
// Both are widened through fp16: a byte placed in an fp16's bits (half_bits) is its value / kWidenScale, so
// one conversion widens a vector of them. e4m3fn: sign << 15 | (b & 0x7F) << 7 is the value / 2^8 (fp16's
// exponent bias is 15, e4m3's 7; both have subnormals, and e4m3's largest exponent is an ordinary fp16 one);
// e4m3fn has no infinities, and its NaN, |b| = 0x7F, would read as 1.875 * 2^-8 (see has_nan). e5m2 is
// fp16's top byte (same exponent, two mantissa bits): b << 8 is the value itself, infinities and NaN too.
struct E4m3fn {
  uint8_t bits;
  static constexpr int kMantissaBits = 3, kBias = 7;
  static constexpr uint8_t kLargest = 0x7E;  // 448
  static constexpr float kLargestValue = 448.f, kWidenScale = 256.f;
  static constexpr bool is_nan(uint8_t b) { return (b & 0x7F) == 0x7F; }
  static constexpr uint16_t half_bits(uint8_t b) { return (b & 0x80) << 8 | (b & 0x7F) << 7; }
};

struct E5m2 {
  uint8_t bits;
  static constexpr int kMantissaBits = 2, kBias = 15;
  static constexpr uint8_t kLargest = 0x7B;  // 57344
  static constexpr float kLargestValue = 57344.f, kWidenScale = 1.f;
  static constexpr bool is_nan(uint8_t b) { return (b & 0x7F) > 0x7C; }
  static constexpr uint16_t half_bits(uint8_t b) { return b << 8; }
};

template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, E4m3fn> || std::is_same_v<T, E5m2>;

// fn(E4m3fn{}) or fn(E5m2{}) for the format named "e4m3fn" or "e5m2" (what the Python side passes).
template <typename Fn>
inline void with_fp8_format(const std::string& name, Fn&& fn) {
  if (name == "e4m3fn") return fn(E4m3fn{});
  TORCH_CHECK(name == "e5m2", "fp8 format must be \"e4m3fn\" or \"e5m2\", got \"", name, "\"");
  fn(E5m2{});
}

template <typename F>
inline float decode(F v) {
  if constexpr (std::is_same_v<F, E4m3fn>) {
    if (F::is_nan(v.bits)) {  // no fp16 NaN in the widening
      const uint32_t nan = static_cast<uint32_t>(v.bits & 0x80) << 24 | 0x7FC00000u;
      float out;
      std::memcpy(&out, &nan, sizeof out);
      return out;
    }
  }
  return half_to_float(F::half_bits(v.bits)) * F::kWidenScale;  // exact: a power of two
}

// x rounded to the nearest value of format F, ties to the even bit pattern, saturated at the largest finite
// value; NaN stays NaN (0x7F, NaN in both formats). What `x.clamp(-max, max).to(float8)` gives in torch.
template <typename F>
inline F encode(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint8_t sign = (bits >> 24) & 0x80;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  const float a = std::fabs(x);
  if (std::isnan(a)) return {static_cast<uint8_t>(sign | 0x7F)};
  if (a >= F::kLargestValue) return {static_cast<uint8_t>(sign | F::kLargest)};
  constexpr float kSmallestNormal = 1.f / (1u << (F::kBias - 1));
  if (a < kSmallestNormal) {
    // a subnormal: adding a float whose last mantissa bit is worth the format's spacing rounds a to a
    // multiple of it (to nearest even, as floating-point addition does), counted by the mantissa
    constexpr float kRounder = kSmallestNormal * (1u << (23 - F::kMantissaBits));
    const float rounded = a + kRounder;
    uint32_t rounded_bits, rounder_bits;
    std::memcpy(&rounded_bits, &rounded, sizeof rounded_bits);
    std::memcpy(&rounder_bits, &kRounder, sizeof rounder_bits);
    return {static_cast<uint8_t>(sign | (rounded_bits - rounder_bits))};
  }
  // a normal value: the mantissa rounded to nearest even at the format's last bit (a carry moves into the
  // exponent), then the exponent rebiased
  constexpr int kDropped = 23 - F::kMantissaBits;
  const uint32_t rounded = magnitude + ((1u << (kDropped - 1)) - 1) + ((magnitude >> kDropped) & 1);
  return {static_cast<uint8_t>(sign | ((rounded >> kDropped) - ((127u - F::kBias) << F::kMantissaBits)))};
}

// Whether any of n values is a NaN pattern (the compiler vectorizes the loop).
template <typename F>
inline bool has_nan(const F* p, int64_t n) {
  uint8_t found = 0;
#pragma omp simd reduction(| : found)
  for (int64_t i = 0; i < n; ++i) found |= static_cast<uint8_t>(F::is_nan(p[i].bits));
  return found != 0;
}

#if defined(__AVX2__) && defined(__F16C__)
// half_bits on int16 lanes holding bytes (any vector width). e4m3fn: b << 8 then an arithmetic shift by one:
// the sign stays in bit 15 and is copied into bit 14, which the mask clears; exponent and mantissa land in
// bits 13..7.
template <typename F, typename Words>
inline Words half_bits(Words bytes) {
  if constexpr (std::is_same_v<F, E4m3fn>) {
    return ((bytes << 8) >> 1) & static_cast<int16_t>(~0x4000);
  } else {
    return bytes << 8;
  }
}
#endif

// kLanes values / F::kWidenScale (e4m3fn's NaN patterns excepted: see has_nan).
template <typename F>
inline Vec widen(const F* p) {
#if defined(PAGEDSERVE_VEC_AVX512)
  using Words = int16_t __attribute__((vector_size(32)));
  const Words bytes = (Words)_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps((__m256i)half_bits<F>(bytes));
#elif defined(__AVX2__) && defined(__F16C__)
  using Words = int16_t __attribute__((vector_size(16)));
  const Words bytes = (Words)_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtph_ps((__m128i)half_bits<F>(bytes));
#else
  Vec v;
  for (int i = 0; i < kLanes; ++i) v[i] = half_to_float(F::half_bits(p[i].bits));
  return v;
#endif
}

// 2 * kLanes values / F::kWidenScale into two vectors. NOTE: with AVX-512 one 512-bit integer widening
// serves both halves (a quarter fewer instructions per weight in the fp8 matmul's decode, which they bound).
template <typename F>
inline void widen_pair(const F* p, Vec& low, Vec& high) {
#if defined(PAGEDSERVE_VEC_AVX512)
  using Words = int16_t __attribute__((vector_size(64)));
  const Words bytes = (Words)_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i half = (__m512i)half_bits<F>(bytes);
  low = _mm512_cvtph_ps(_mm512_castsi512_si256(half));
  high = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(half, 1));
#else
  low = widen(p);
  high = widen(p + kLanes);
#endif
}

}  // namespace vec
