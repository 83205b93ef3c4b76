// Matmul on GGUF-quantized weights, kept in their file's blocks: y = x W^T with W [N, K] stored as N rows
// of ggml blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K; F32 and F16 rows as blocks of one).
//
// Why float activations and not llama.cpp's 8-bit ones: the engine promises the dequantized float32
// model's logits within 1e-3 relative, and 8-bit activations round each value by up to 1/254 of its
// block's largest. The price, measured in benchmarks/quant_kernels.py: at batch 1 this kernel is bound by
// the dequantization's arithmetic, not yet by the weight bytes it reads (a fused nibble-to-float dot
// without the row buffer is the next step).
//
// Small batches (decode): each thread dequantizes one weight row at a time into its buffer and dots it with
// every activation row, so each weight byte is read once per step. Large batches (prefill): tiles of rows
// are dequantized to float32 and multiplied by ATen's GEMM, where the dequantization is a small fraction
// of the B*K*N multiply-adds.
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/extension.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// ggml's type ids (gguf.GGMLQuantizationType).
enum GgmlType : int64_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

struct BlockFormat {
  int64_t weights;  // per block
  int64_t bytes;    // per block
};

BlockFormat block_format(int64_t type) {
  switch (type) {
    case F32: return {1, 4};
    case F16: return {1, 2};
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q8_0: return {32, 34};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    default: TORCH_CHECK(false, "GGML type ", type, " has no native kernel");
  }
  return {0, 0};
}

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

void dequantize_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int l = 0; l < 16; ++l) {
    y[l] = d * (static_cast<int>(qs[l] & 0xF) - 8);
    y[l + 16] = d * (static_cast<int>(qs[l] >> 4) - 8);
  }
}

void dequantize_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int l = 0; l < 16; ++l) {
    y[l] = d * (qs[l] & 0xF) + m;
    y[l + 16] = d * (qs[l] >> 4) + m;
  }
}

void dequantize_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int l = 0; l < 32; ++l) y[l] = d * qs[l];
}

// The 6-bit scale and min of sub-block j of a K-quant super-block (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K and Q5_K share their layout but for Q5_K's fifth bits (qh, 32 bytes before the nibbles).
template <bool kFifthBit>
void dequantize_k4_k5(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* q = kFifthBit ? b + 48 : b + 16;
  for (int j = 0; j < 8; j += 2) {
    int sc1, m1, sc2, m2;
    scale_min_k4(j, scales, &sc1, &m1);
    scale_min_k4(j + 1, scales, &sc2, &m2);
    const float d1 = d * sc1, min1 = dmin * m1, d2 = d * sc2, min2 = dmin * m2;
    const uint8_t low_bit = 1 << j, high_bit = 2 << j;
    for (int l = 0; l < 32; ++l) {
      const int high1 = kFifthBit && (qh[l] & low_bit) ? 16 : 0;
      const int high2 = kFifthBit && (qh[l] & high_bit) ? 16 : 0;
      y[l] = d1 * ((q[l] & 0xF) + high1) - min1;
      y[l + 32] = d2 * ((q[l] >> 4) + high2) - min2;
    }
    q += 32;
    y += 64;
  }
}

void dequantize_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int n = 0; n < 2; ++n) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

using BlockDequantizer = void (*)(const uint8_t*, float*);

void dequantize_f32(const uint8_t* b, float* y) { std::memcpy(y, b, sizeof(float)); }
void dequantize_f16(const uint8_t* b, float* y) { *y = half_at(b); }

BlockDequantizer block_dequantizer(int64_t type) {
  switch (type) {
    case F32: return dequantize_f32;
    case F16: return dequantize_f16;
    case Q4_0: return dequantize_q4_0;
    case Q4_1: return dequantize_q4_1;
    case Q8_0: return dequantize_q8_0;
    case Q4_K: return dequantize_k4_k5<false>;
    case Q5_K: return dequantize_k4_k5<true>;
    case Q6_K: return dequantize_q6_k;
    default: TORCH_CHECK(false, "GGML type ", type, " has no native kernel");
  }
  return nullptr;
}

struct QuantizedRows {
  const uint8_t* data;
  int64_t rows;
  int64_t cols;       // K, weights per row
  int64_t row_bytes;  // bytes per row
  BlockFormat format;
  BlockDequantizer dequantize_block;

  void dequantize_row(int64_t row, float* out) const {
    const uint8_t* block = data + row * row_bytes;
    for (int64_t k = 0; k < cols; k += format.weights, block += format.bytes) dequantize_block(block, out + k);
  }
};

QuantizedRows check_rows(const at::Tensor& qweight, int64_t type, int64_t cols) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte && qweight.is_contiguous(),
              "qweight must be a contiguous uint8 [rows, row_bytes] tensor");
  const BlockFormat format = block_format(type);
  TORCH_CHECK(cols % format.weights == 0, "K=", cols, " is not a multiple of the block size ", format.weights);
  TORCH_CHECK(qweight.size(1) == cols / format.weights * format.bytes, "qweight has ", qweight.size(1),
              " bytes per row; K=", cols, " of GGML type ", type, " needs ", cols / format.weights * format.bytes);
  return {qweight.data_ptr<uint8_t>(), qweight.size(0), cols, qweight.size(1), format, block_dequantizer(type)};
}

// Eight float lanes (one AVX2 register); the compiler lowers it to whatever the target has.
using Vec = float __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

inline Vec load_vec(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// sum_k w[k] * x[k], with four independent accumulators so the FMAs pipeline.
inline float row_dot(const float* w, const float* x, int64_t n) {
  Vec a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t k = 0;
  for (; k + 4 * kLanes <= n; k += 4 * kLanes) {
    a0 += load_vec(w + k) * load_vec(x + k);
    a1 += load_vec(w + k + kLanes) * load_vec(x + k + kLanes);
    a2 += load_vec(w + k + 2 * kLanes) * load_vec(x + k + 2 * kLanes);
    a3 += load_vec(w + k + 3 * kLanes) * load_vec(x + k + 3 * kLanes);
  }
  for (; k + kLanes <= n; k += kLanes) a0 += load_vec(w + k) * load_vec(x + k);
  const Vec s = (a0 + a1) + (a2 + a3);
  float sum = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; k < n; ++k) sum += w[k] * x[k];
  return sum;
}

// Decode path: one weight row at a time, dequantized into a per-thread buffer, dotted with every x row.
void matmul_rowwise(const float* x, int64_t batch, const QuantizedRows& w, float* y) {
  at::parallel_for(0, w.rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(w.cols);
    for (int64_t n = begin; n < end; ++n) {
      w.dequantize_row(n, row.data());
      for (int64_t b = 0; b < batch; ++b) y[b * w.rows + n] = row_dot(row.data(), x + b * w.cols, w.cols);
    }
  });
}

#if defined(__AVX2__) && defined(__FMA__)
// Q4_0, Q4_1 and Q8_0 at small batches, fused: each block's 32 values become four float vectors in
// registers, used for every activation row, without the row buffer. Per block, sum_j (d q_j + c) x_j =
// d (sum_j q_j x_j) + c (sum_j x_j), with c = m (Q4_1), -8 d (Q4_0) or 0 (Q8_0) and the activation's block
// sums computed once per call.
constexpr bool kHasFusedBlocks = true;

inline bool has_fused_path(int64_t type) { return type == Q4_0 || type == Q4_1 || type == Q8_0; }

inline __m256 unsigned_bytes_to_floats(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }

// The 32 unscaled values of a block (nibbles, or int8 for Q8_0) as four vectors of eight, in order.
inline void block_values(int64_t type, const uint8_t* qs, __m256 values[4]) {
  if (type == Q8_0) {
    for (int i = 0; i < 4; ++i) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * i));
      values[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    }
    return;
  }
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low_bits = _mm_set1_epi8(0x0F);
  const __m128i low = _mm_and_si128(bytes, low_bits);                      // weights 0..15
  const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_bits);  // weights 16..31
  values[0] = unsigned_bytes_to_floats(low);
  values[1] = unsigned_bytes_to_floats(_mm_srli_si128(low, 8));
  values[2] = unsigned_bytes_to_floats(high);
  values[3] = unsigned_bytes_to_floats(_mm_srli_si128(high, 8));
}

void matmul_fused_blocks(const float* x, int64_t batch, const QuantizedRows& w, int64_t type, float* y);
#else
constexpr bool kHasFusedBlocks = false;
inline bool has_fused_path(int64_t) { return false; }
inline void matmul_fused_blocks(const float*, int64_t, const QuantizedRows&, int64_t, float*) {}
#endif

void dequantize_into(const QuantizedRows& w, int64_t first, int64_t count, float* out) {
  at::parallel_for(first, first + count, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) w.dequantize_row(n, out + (n - first) * w.cols);
  });
}

#if defined(__AVX2__) && defined(__FMA__)
void matmul_fused_blocks(const float* x, int64_t batch, const QuantizedRows& w, int64_t type, float* y) {
  constexpr int64_t kMaxBatch = 8;  // = kRowwiseMaxBatch: the accumulators live on the stack
  TORCH_CHECK(batch <= kMaxBatch, "fused GGUF path takes at most ", kMaxBatch, " rows");
  const int64_t blocks = w.cols / 32;
  std::vector<float> block_sums(batch * blocks);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < blocks; ++i) {
      float sum = 0.f;
      for (int64_t j = 0; j < 32; ++j) sum += x[b * w.cols + 32 * i + j];
      block_sums[b * blocks + i] = sum;
    }
  const int64_t values_offset = type == Q4_1 ? 4 : 2;  // after d (and m)
  at::parallel_for(0, w.rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      __m256 acc[kMaxBatch];
      float offsets[kMaxBatch];
      for (int64_t b = 0; b < batch; ++b) acc[b] = _mm256_setzero_ps(), offsets[b] = 0.f;
      const uint8_t* block = w.data + n * w.row_bytes;
      for (int64_t i = 0; i < blocks; ++i, block += w.format.bytes) {
        const float d = half_at(block);
        const float c = type == Q4_1 ? half_at(block + 2) : type == Q4_0 ? -8.f * d : 0.f;
        __m256 values[4];
        block_values(type, block + values_offset, values);
        const __m256 scale = _mm256_set1_ps(d);
        for (int64_t b = 0; b < batch; ++b) {
          const float* xb = x + b * w.cols + 32 * i;
          __m256 dot = _mm256_mul_ps(values[0], _mm256_loadu_ps(xb));
          dot = _mm256_fmadd_ps(values[1], _mm256_loadu_ps(xb + 8), dot);
          dot = _mm256_fmadd_ps(values[2], _mm256_loadu_ps(xb + 16), dot);
          dot = _mm256_fmadd_ps(values[3], _mm256_loadu_ps(xb + 24), dot);
          acc[b] = _mm256_fmadd_ps(scale, dot, acc[b]);
          offsets[b] += c * block_sums[b * blocks + i];
        }
      }
      for (int64_t b = 0; b < batch; ++b) {
        Vec lanes;
        std::memcpy(&lanes, &acc[b], sizeof lanes);
        y[b * w.rows + n] = (((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
                             ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))) + offsets[b];
      }
    }
  });
}
#endif

// Batches up to this size take the row-wise path (each weight byte read once per step); larger ones
// amortize a dequantized tile over enough rows for ATen's GEMM to win.
constexpr int64_t kRowwiseMaxBatch = 8;
constexpr int64_t kTileFloats = int64_t{1} << 20;  // 4 MiB of dequantized weights per GEMM tile

}  // namespace

// x [B, K] float32; qweight [N, row_bytes] uint8 (N rows of GGML `type` blocks); returns x W^T, [B, N].
at::Tensor gguf_matmul(const at::Tensor& x, const at::Tensor& qweight, int64_t type) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a float32 [B, K] tensor");
  const at::Tensor xc = x.contiguous();
  const QuantizedRows w = check_rows(qweight, type, xc.size(1));
  const int64_t batch = xc.size(0);
  at::Tensor y = at::empty({batch, w.rows}, xc.options());
  if (batch <= kRowwiseMaxBatch) {
    if (kHasFusedBlocks && has_fused_path(type))
      matmul_fused_blocks(xc.data_ptr<float>(), batch, w, type, y.data_ptr<float>());
    else
      matmul_rowwise(xc.data_ptr<float>(), batch, w, y.data_ptr<float>());
    return y;
  }
  const int64_t tile_rows = std::max<int64_t>(64, kTileFloats / w.cols);
  at::Tensor tile = at::empty({std::min(tile_rows, w.rows), w.cols}, xc.options());
  for (int64_t first = 0; first < w.rows; first += tile_rows) {
    const int64_t count = std::min(tile_rows, w.rows - first);
    at::Tensor part = tile.narrow(0, 0, count);
    dequantize_into(w, first, count, part.data_ptr<float>());
    y.narrow(1, first, count).copy_(at::mm(xc, part.t()));
  }
  return y;
}

// qweight [N, row_bytes] uint8 of GGML `type` with K weights per row -> float32 [N, K].
at::Tensor gguf_dequantize(const at::Tensor& qweight, int64_t type, int64_t cols) {
  const at::Tensor qc = qweight.contiguous();
  const QuantizedRows w = check_rows(qc, type, cols);
  at::Tensor out = at::empty({w.rows, cols}, qweight.options().dtype(at::kFloat));
  dequantize_into(w, 0, w.rows, out.data_ptr<float>());
  return out;
}

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  m.def("gguf_matmul(Tensor x, Tensor qweight, int type) -> Tensor", gguf_matmul);
  m.def("gguf_dequantize(Tensor qweight, int type, int cols) -> Tensor", gguf_dequantize);
}
