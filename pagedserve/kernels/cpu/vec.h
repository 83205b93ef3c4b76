// The vector lanes every native CPU kernel is written against: float32 lanes loaded from float32, bfloat16
// and fp16, their fused multiply-add and horizontal sum. The quantized matmuls' integer lanes are in
// vec_int.h, the fp8 formats in vec_fp8.h, both on these.
//
// Lanes are GCC/Clang vector extensions: + - * act lane by lane, a float vector converts to and from the
// intrinsics' __m256 / __m512 of its size, and a width the target lacks is lowered by the compiler (so the
// 8-lane code builds, as plain C++, where there is no AVX). `Vec` is the widest the build has: 16 lanes with
// AVX-512 (F and BW: every CPU torch calls AVX512), else 8. What the operators cannot say (a multiply-add
// fused in a fixed order, horizontal sums, fp16 widening) is an intrinsic here (and in vec_int.h, vec_fp8.h),
// for AVX-512 and AVX2, with a plain C++ fallback where a kernel has one.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

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

}  // namespace vec
