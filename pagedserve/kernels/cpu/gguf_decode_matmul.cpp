// The decode-time GGUF matmul on 32-weight blocks (Q4_0, Q4_1, Q8_0, MXFP4; the sub-blocks of Q4_K and Q5_K), batch
// 1..kDecodeMaxBatch: each thread takes a range of weight rows, each block is unpacked once into registers
// and dotted with every activation row's block, so each weight byte is read once per call. Per block, sum_j (d q_j + c) x_j =
// d (sum_j q_j x_j) + c (sum_j x_j), with c = m (Q4_1), -8 d (Q4_0) or 0 (Q8_0, MXFP4). MXFP4's q are its E2M1
// values doubled (signed integers up to 12, one byte shuffle per 16 codes) and d = 2^(e - 128), so its
// integer dot is exact and the power-of-two scale joins the activation scale in the float epilogue.
//
// Activations in one of three widths (`activation_bits`):
// - 32: x's float values, the dequantized model's exact arithmetic (four conversions and FMAs per 8 weights);
// - 8 (llama.cpp's Q8_0/Q8_1 activations) or 16: each 32-value block of x becomes integers q and one scale
//   (x ~ scale q, symmetric, scale = max|x| / 127 or / 32767) and the dot is an integer one (AVX2
//   maddubs/madd, or AVX-VNNI's dpbusd/dpwssd), scaled once per block in float. 8 bits round each value by
//   up to 1/254 of its block's largest, 16 bits by 1/65534, for one more widening per block.
// Which one the engine uses, and why, is decided in quantization/gguf.py from the logits error measured on
// SmolLM2 (docs/benchmarks.md, Activation precision).
#include "gguf_blocks.h"

#include <ATen/Parallel.h>


namespace gguf {

#if defined(__AVX2__) && defined(__FMA__)

namespace {

using vec::Floats8;  // a 32-weight block is four of them

constexpr int64_t kRowGrain = 16;  // weight rows per task: enough work to pay for a thread's wake-up

inline __m128i load64(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Q4_0 / Q4_1 nibbles: byte j holds weight j (low nibble) and weight j + 16 (high).
inline __m128i low_nibbles(__m128i bytes) { return _mm_and_si128(bytes, _mm_set1_epi8(0x0F)); }
inline __m128i high_nibbles(__m128i bytes) { return _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F)); }

// An MXFP4 block's 32 doubled E2M1 values (signed bytes) in order, nibbles laid out as Q4_0's.
inline __m256i mxfp4_values(const uint8_t* qs) {
  const __m128i table = load128(kMxfp4Doubled), bytes = load128(qs);
  return _mm256_set_m128i(_mm_shuffle_epi8(table, high_nibbles(bytes)), _mm_shuffle_epi8(table, low_nibbles(bytes)));
}

// A weight block's 32 unscaled values, unpacked once and dotted with every activation row's block (a
// vector of eight partial sums).
template <int64_t kType, typename Value>
struct WeightBlock;

inline Floats8 bytes_to_floats(__m128i eight_bytes, bool is_signed) {
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(eight_bytes) : _mm256_cvtepu8_epi32(eight_bytes));
}

template <int64_t kType>
struct WeightBlock<kType, float> {  // four vectors of eight floats, in order
  Floats8 values[4];
  explicit WeightBlock(__m256i in_order) {  // 32 unsigned values (K-quant sub-blocks)
    const __m128i low = _mm256_castsi256_si128(in_order), high = _mm256_extracti128_si256(in_order, 1);
    values[0] = bytes_to_floats(low, false);
    values[1] = bytes_to_floats(_mm_srli_si128(low, 8), false);
    values[2] = bytes_to_floats(high, false);
    values[3] = bytes_to_floats(_mm_srli_si128(high, 8), false);
  }
  explicit WeightBlock(const uint8_t* qs) {
    if constexpr (kType == Q8_0) {
      for (int i = 0; i < 4; ++i) values[i] = bytes_to_floats(load64(qs + 8 * i), true);
    } else if constexpr (kType == MXFP4) {
      const __m256i in_order = mxfp4_values(qs);
      const __m128i low = _mm256_castsi256_si128(in_order), high = _mm256_extracti128_si256(in_order, 1);
      values[0] = bytes_to_floats(low, true);
      values[1] = bytes_to_floats(_mm_srli_si128(low, 8), true);
      values[2] = bytes_to_floats(high, true);
      values[3] = bytes_to_floats(_mm_srli_si128(high, 8), true);
    } else {
      const __m128i bytes = load128(qs), low = low_nibbles(bytes), high = high_nibbles(bytes);
      values[0] = bytes_to_floats(low, false);
      values[1] = bytes_to_floats(_mm_srli_si128(low, 8), false);
      values[2] = bytes_to_floats(high, false);
      values[3] = bytes_to_floats(_mm_srli_si128(high, 8), false);
    }
  }
  Floats8 dot(const float* x) const {
    Floats8 sum = values[0] * vec::load<Floats8>(x);
    sum = vec::fma(values[1], vec::load<Floats8>(x + 8), sum);
    sum = vec::fma(values[2], vec::load<Floats8>(x + 16), sum);
    return vec::fma(values[3], vec::load<Floats8>(x + 24), sum);
  }
};

template <int64_t kType>
struct WeightBlock<kType, int8_t> {  // unsigned bytes
  __m256i values;
  explicit WeightBlock(__m256i in_order) : values(in_order) {}
  explicit WeightBlock(const uint8_t* qs) {
    const __m128i bytes = load128(qs);
    values = _mm256_set_m128i(high_nibbles(bytes), low_nibbles(bytes));
  }
  Floats8 dot(const int8_t* x) const { return _mm256_cvtepi32_ps(vec::dot_groups(values, load256(x))); }
};

// Block types whose 32 weights are signed bytes: Q8_0's stored, MXFP4's looked up from their codes.
template <int64_t kType>
constexpr bool kSignedBytes = kType == Q8_0 || kType == MXFP4;

template <int64_t kType>
inline __m256i signed_values(const uint8_t* qs) {
  if constexpr (kType == MXFP4) return mxfp4_values(qs);
  return load256(qs);
}

template <int64_t kType>
  requires kSignedBytes<kType>
struct WeightBlock<kType, int8_t> {  // |w| times x with w's sign (the unsigned operand is |w|)
  __m256i values, magnitudes;
  explicit WeightBlock(const uint8_t* qs) : values(signed_values<kType>(qs)), magnitudes(_mm256_abs_epi8(values)) {}
  Floats8 dot(const int8_t* x) const {
    return _mm256_cvtepi32_ps(vec::dot_groups(magnitudes, _mm256_sign_epi8(load256(x), values)));
  }
};

inline Floats8 dot_int16_blocks(__m256i low, __m256i high, const int16_t* x) {
  return _mm256_cvtepi32_ps(vec::dot_pairs(_mm256_madd_epi16(low, load256(x)), high, load256(x + 16)));
}

template <int64_t kType>
struct WeightBlock<kType, int16_t> {  // unsigned values widened to int16: weights 0..15 and 16..31
  __m256i low, high;
  explicit WeightBlock(__m256i in_order)
      : low(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(in_order))),
        high(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(in_order, 1))) {}
  explicit WeightBlock(const uint8_t* qs) {
    const __m128i bytes = load128(qs);
    low = _mm256_cvtepu8_epi16(low_nibbles(bytes));
    high = _mm256_cvtepu8_epi16(high_nibbles(bytes));
  }
  Floats8 dot(const int16_t* x) const { return dot_int16_blocks(low, high, x); }
};

template <int64_t kType>
  requires kSignedBytes<kType>
struct WeightBlock<kType, int16_t> {  // signed bytes widened to int16: weights 0..15 and 16..31
  __m256i low, high;
  explicit WeightBlock(const uint8_t* qs) {
    const __m256i in_order = signed_values<kType>(qs);
    low = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(in_order));
    high = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(in_order, 1));
  }
  Floats8 dot(const int16_t* x) const { return dot_int16_blocks(low, high, x); }
};

// A block's weights are d q + c: c = m (Q4_1), -8 d (Q4_0), 0 (Q8_0, MXFP4); q starts after d (and m).
template <int64_t kType>
constexpr int64_t kValuesOffset = kType == Q4_1 ? 4 : kType == MXFP4 ? 1 : 2;

template <int64_t kType>
constexpr bool kHasOffset = kType != Q8_0 && kType != MXFP4;

template <int64_t kType>
inline float block_scale(const uint8_t* block) {
  if constexpr (kType == MXFP4) return e8m0_half(block[0]);
  return half_at(block);
}

template <int64_t kType>
inline float block_offset(const uint8_t* block, float d) {
  if constexpr (kType == Q4_1) return half_at(block + 2);
  if constexpr (kType == Q4_0) return -8.f * d;
  return 0.f;
}

// Adds the products of a 32-weight block (weights d q + c) with every activation row's block i.
template <int64_t kType, typename Value, int64_t kBatch>
__attribute__((always_inline)) inline void add_scaled(const WeightBlock<kType, Value>& weights, float d, float c,
                                                      const ActivationBlocks<Value>& a, int64_t i, int64_t blocks,
                                                      Floats8 (&acc)[kBatch], float (&offsets)[kBatch]) {
#pragma GCC unroll 8
  for (int64_t b = 0; b < kBatch; ++b) {
    const int64_t at = b * blocks + i;
    acc[b] = vec::fma(weights.dot(a.values + at * kBlock), vec::splat<Floats8>(d * a.scales[at]), acc[b]);
    if constexpr (kHasOffset<kType>) offsets[b] += c * a.sums[at];
  }
}

template <int64_t kType, typename Value, int64_t kBatch>
__attribute__((always_inline)) inline void add_block(const uint8_t* block, const ActivationBlocks<Value>& a,
                                                     int64_t i, int64_t blocks, Floats8 (&acc)[kBatch],
                                                     float (&offsets)[kBatch]) {
  const float d = block_scale<kType>(block);
  add_scaled<kType>(WeightBlock<kType, Value>(block + kValuesOffset<kType>), d, block_offset<kType>(block, d), a,
                    i, blocks, acc, offsets);
}

// Q4_K / Q5_K: a 256-weight super-block is eight 32-weight sub-blocks j, weights d sc_j q - dmin m_j; bytes
// 32p..32p+31 hold sub-block 2p (low nibbles) and 2p+1 (high); Q5_K's bit j of qh[l] adds 16 to weight l
// of sub-block j. Sub-blocks alternate between the accumulator chains. `i`: the first activation block.
template <int64_t kType, typename Value, int64_t kChains, int64_t kBatch>
__attribute__((always_inline)) inline void add_super_block(const uint8_t* block, const ActivationBlocks<Value>& a,
                                                           int64_t i, int64_t blocks,
                                                           Floats8 (&acc)[kChains][kBatch],
                                                           float (&offsets)[kChains][kBatch]) {
  const float d = half_at(block), dmin = half_at(block + 2);
  const uint8_t* q = block + (kType == Q5_K ? 48 : 16);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i fifth_bits = kType == Q5_K ? load256(block + 16) : _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const __m256i bytes = load256(q + 32 * (j / 2));
    __m256i values = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(bytes, 4) : bytes, nibble);
    if constexpr (kType == Q5_K) {
      const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
      const __m256i is_set = _mm256_cmpeq_epi8(_mm256_and_si256(fifth_bits, bit), bit);
      values = _mm256_or_si256(values, _mm256_and_si256(is_set, _mm256_set1_epi8(16)));
    }
    int scale, min;
    scale_min_k4(j, block + 4, &scale, &min);
    add_scaled<kType>(WeightBlock<kType, Value>(values), d * scale, -dmin * min, a, i + j, blocks,
                      acc[j % kChains], offsets[j % kChains]);
  }
}

// kBatch is a template argument so the accumulators live in registers. NOTE: at batch 1 and 2, even and odd
// blocks go to two accumulator chains: one chain would wait on each FMA's latency.
template <int64_t kType, typename Value, int64_t kBatch>
void matmul_rows(const ActivationBlocks<Value>& a, const QuantizedRows& w, float* y) {
  constexpr int64_t kChains = kBatch <= 2 ? 2 : 1;
  const int64_t blocks = w.cols / kBlock, block_bytes = w.format.bytes;
  at::parallel_for(0, w.rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      Floats8 acc[kChains][kBatch];
      float offsets[kChains][kBatch];
      for (int64_t c = 0; c < kChains; ++c)
        for (int64_t b = 0; b < kBatch; ++b) acc[c][b] = Floats8{}, offsets[c][b] = 0.f;
      const uint8_t* row = w.data + n * w.row_bytes;
      if constexpr (kType == Q4_K || kType == Q5_K) {
        for (int64_t i = 0; i < blocks; i += 8, row += block_bytes) add_super_block<kType>(row, a, i, blocks, acc, offsets);
      } else {
        int64_t i = 0;
        for (; i + kChains <= blocks; i += kChains)
#pragma GCC unroll 2
          for (int64_t c = 0; c < kChains; ++c)
            add_block<kType>(row + (i + c) * block_bytes, a, i + c, blocks, acc[c], offsets[c]);
        if (i < blocks) add_block<kType>(row + i * block_bytes, a, i, blocks, acc[0], offsets[0]);
      }
      for (int64_t b = 0; b < kBatch; ++b) {
        Floats8 total = acc[0][b];
        float offset = offsets[0][b];
        for (int64_t c = 1; c < kChains; ++c) total = total + acc[c][b], offset += offsets[c][b];
        y[b * w.rows + n] = vec::sum(total) + offset;
      }
    }
  });
}

template <int64_t kType, typename Value, int64_t kBatch = 1>
void matmul_batch(const ActivationBlocks<Value>& a, int64_t batch, const QuantizedRows& w, float* y) {
  if constexpr (kBatch < kDecodeMaxBatch) {
    if (batch != kBatch) return matmul_batch<kType, Value, kBatch + 1>(a, batch, w, y);
  }
  matmul_rows<kType, Value, kBatch>(a, w, y);
}

template <typename Value>
void matmul_type(const ActivationBlocks<Value>& a, int64_t batch, const QuantizedRows& w, int64_t type, float* y) {
  switch (type) {
    case Q4_0: return matmul_batch<Q4_0>(a, batch, w, y);
    case Q4_1: return matmul_batch<Q4_1>(a, batch, w, y);
    case Q8_0: return matmul_batch<Q8_0>(a, batch, w, y);
    case MXFP4: return matmul_batch<MXFP4>(a, batch, w, y);
    case Q4_K: return matmul_batch<Q4_K>(a, batch, w, y);
    case Q5_K: return matmul_batch<Q5_K>(a, batch, w, y);
    default: TORCH_CHECK(false, "GGML type ", type, " has no block decode kernel");
  }
}

}  // namespace

bool has_block_decode_path(int64_t type) {
  return type == Q4_0 || type == Q4_1 || type == Q8_0 || type == MXFP4 || type == Q4_K || type == Q5_K;
}

void matmul_decode_blocks(const float* x, int64_t batch, const QuantizedRows& w, int64_t type,
                          int64_t activation_bits, float* y) {
  TORCH_CHECK(batch >= 1 && batch <= kDecodeMaxBatch, "the GGUF decode kernel takes 1 to ", kDecodeMaxBatch,
              " rows, got ", batch);
  if (activation_bits == 8) return matmul_type(rounded_activations<int8_t>(x, batch, w.cols), batch, w, type, y);
  if (activation_bits == 16) return matmul_type(rounded_activations<int16_t>(x, batch, w.cols), batch, w, type, y);
  TORCH_CHECK(activation_bits == 32, "activation_bits must be 8, 16 or 32, got ", activation_bits);
  matmul_type(float_activations(x, batch, w.cols), batch, w, type, y);
}

#else  // no AVX2+FMA: the row-wise float path of gguf_matmul.cpp serves every type

bool has_block_decode_path(int64_t) { return false; }

void matmul_decode_blocks(const float*, int64_t, const QuantizedRows&, int64_t, int64_t, float*) {
  TORCH_CHECK(false, "this build has no AVX2+FMA GGUF decode kernel");
}

#endif

}  // namespace gguf
