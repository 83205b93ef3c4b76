// The vector lanes every native CPU kernel is written against: float32 lanes loaded from float32, bfloat16,
// fp16 and fp8, their fused multiply-add and horizontal sum, the integer dot products of the quantized
// matmuls, and the fp8 formats (e4m3fn, e5m2) read and written as torch reads and writes them.
//
// Lanes are GCC/Clang vector extensions: + - * act lane by lane, a float vector converts to and from the
// intrinsics' __m256 / __m512 of its size, and a width the target lacks is lowered by the compiler (so the
// 8-lane code builds, as plain C++, where there is no AVX). `Vec` is the widest the build has: 16 lanes with
// AVX-512 (F and BW: every CPU torch calls AVX512), else 8. What the operators cannot say (a multiply-add
// fused in a fixed order, horizontal sums, fp16 and fp8 widening, integer dot products) is an intrinsic here,
// for AVX-512 and AVX2, with a plain C++ fallback where a kernel has one.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define PAGEDSERVE_VEC_AVX512 1
#endif

namespace vec {

// ---- float32 lanes ----------------------------------------------------------------------------------------

using Floats8 = float __attribute__((vector_size(8 * sizeof(float))));
#if defined(PAGEDSERVE_VEC_AVX512)
using Vec = float __attribute__((vector_size(16 * sizeof(float))));
#else
using Vec = Floats8;
#endif
constexpr int kLanes = sizeof(Vec) / sizeof(float);

// The vector code this build has (benchmarks and tests print it): "scalar" is the plain C++ fallback.
#if defined(PAGEDSERVE_VEC_AVX512)
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr const char* kIsa = "avx2";
#else
constexpr const char* kIsa = "scalar";
#endif

// Unaligned loads and stores of float32 lanes (Floats8 or Vec).
template <typename V = Vec>
inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename V>
inline void store(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

template <typename V = Vec>
inline V splat(float x) {
  return x - V{};  // x in every lane (x - 0 is x, -0 and NaN included)
}

// kLanes bfloat16 or fp16 values widened to float32 (exactly: both are narrower float formats).
inline Vec load(const c10::BFloat16* p) {
#if defined(PAGEDSERVE_VEC_AVX512)
  const __m512i words = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
#elif defined(__AVX2__)
  const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
#else
  Vec v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}

inline Vec load(const c10::Half* p) {
#if defined(PAGEDSERVE_VEC_AVX512)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  Vec v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}

// One fp16 value (a GGUF block's scale, an fp8 value on its way). NOTE: F16C's one instruction where the
// build has it: c10's portable bit manipulation costs more than a whole GGUF block's integer dot.
inline float half_to_float(uint16_t bits) {
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return c10::detail::fp16_ieee_to_fp32_value(bits);
#endif
}

// a * b + c rounded once, always. NOTE: `acc += a * b` with the operators is fused too under the build's
// -ffp-contract=fast, but as the compiler chooses: in a * b + c * d either product, and not in a loop-carried
// chain of 256-bit or scalar multiply-adds where its tuning avoids them (GCC's for Zen). Loops that leave it
// to the compiler (attention, the GGUF row dot) use the operators; the quantized matmuls fix it with fma().
inline Floats8 fma(Floats8 a, Floats8 b, Floats8 c) {
#if defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// The sum of a vector's lanes as a tree: halves added until four lanes are left, then (0 + 2) + (1 + 3).
inline float sum(Floats8 v) {
#if defined(__AVX__)
  const __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 twos = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_add_ss(twos, _mm_movehdup_ps(twos)));
#else
  using Floats4 = float __attribute__((vector_size(4 * sizeof(float))));
  Floats4 low, high;
  std::memcpy(&low, &v, sizeof low);
  std::memcpy(&high, reinterpret_cast<const char*>(&v) + sizeof low, sizeof high);
  const Floats4 s = low + high;
  return (s[0] + s[2]) + (s[1] + s[3]);
#endif
}

#if defined(PAGEDSERVE_VEC_AVX512)
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float sum(Vec v) { return _mm512_reduce_add_ps(v); }  // the same tree, from 16 lanes
#endif

// out[i] = sum() of the i-th of four vectors, bit for bit (the same tree), in about two thirds of the
// instructions of four sum() calls (the attention score loop's largest cost): the four are reduced side by
// side, their lanes moved between registers. NOTE: as fast as the neighbour-first hadd form it replaced
// (min of 6 interleaved runs, benchmarks/cpu_attention.py shapes), which summed in another order than sum().
inline void sum4(Vec a, Vec b, Vec c, Vec d, float* out) {
#if defined(__AVX__)
  const auto to256 = [](Vec v) -> __m256 {
#if defined(PAGEDSERVE_VEC_AVX512)
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
#else
    return v;
#endif
  };
  const __m256 a8 = to256(a), b8 = to256(b), c8 = to256(c), d8 = to256(d);
  // halves added: ab = [a's four lane sums | b's], cd = [c's | d's]
  const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a8, b8, 0x20), _mm256_permute2f128_ps(a8, b8, 0x31));
  const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c8, d8, 0x20), _mm256_permute2f128_ps(c8, d8, 0x31));
  // lanes 0 + 2 and 1 + 3 of each: [a02, c02, a13, c13 | b02, d02, b13, d13], then 02 + 13
  const __m256 twos = _mm256_add_ps(_mm256_unpacklo_ps(ab, cd), _mm256_unpackhi_ps(ab, cd));
  const __m256 sums = _mm256_add_ps(twos, _mm256_permute_ps(twos, _MM_SHUFFLE(1, 0, 3, 2)));
  _mm_storeu_ps(out, _mm_unpacklo_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1)));
#else
  out[0] = sum(a), out[1] = sum(b), out[2] = sum(c), out[3] = sum(d);
#endif
}

// ---- integer lanes (AVX2 up): the dot products of the quantized matmuls -------------------------------------

#if defined(__AVX2__)
// Int16s: 2 * kLanes int16 lanes, Int32s: kLanes int32 lanes, each in one Vec-sized register.
using Int16s = int16_t __attribute__((vector_size(sizeof(Vec))));
using Int32s = int32_t __attribute__((vector_size(sizeof(Vec))));

// 2 * kLanes bytes widened to int16 lanes: unsigned or signed.
inline Int16s widen_bytes(const uint8_t* p) {
#if defined(PAGEDSERVE_VEC_AVX512)
  return (Int16s)_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  return (Int16s)_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
}

inline Int16s widen_bytes(const int8_t* p) {
#if defined(PAGEDSERVE_VEC_AVX512)
  return (Int16s)_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  return (Int16s)_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
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
