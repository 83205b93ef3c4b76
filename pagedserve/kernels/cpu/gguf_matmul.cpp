// Matmul on GGUF-quantized weights, kept in their file's blocks: y = x W^T with W [N, K] stored as N rows
// of ggml blocks (Q4_0, Q4_1, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K; F32 and F16 rows as blocks of one).
//
// F32 and F16 rows go to the row-invariant float matmul (float_matmul.cpp) at every batch: a row's result is
// the same bits whatever shares its batch. Quantized types:
// Small batches (decode, batch <= kDecodeMaxBatch): Q4_0/Q4_1/Q8_0/MXFP4/Q4_K/Q5_K go to gguf_decode_matmul.cpp
// (blocks unpacked into registers; float, 16-bit or 8-bit activations as `activation_bits` says); other
// types dequantize each weight row into a per-thread buffer and dot it with every activation row in
// float32. Either way each weight byte is read once per step. Large batches (prefill): tiles of rows are
// dequantized to float32 and multiplied by ATen's GEMM, where the dequantization is a small fraction of the
// B*K*N multiply-adds; activations stay float32 whatever `activation_bits` says.
#include "float_matmul.h"
#include "gguf_blocks.h"

#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

using namespace gguf;  // NOLINT(build/namespaces): the shared declarations of gguf_blocks.h

namespace {

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

// MXFP4: the E8M0 scale byte, then 16 bytes of E2M1 codes (weight l the low nibble of byte l, l + 16 the
// high one); w = (2 e2m1) 2^(e - 128), exact in float32.
void dequantize_mxfp4(const uint8_t* b, float* y) {
  const float d = e8m0_half(b[0]);
  const uint8_t* qs = b + 1;
  for (int l = 0; l < 16; ++l) {
    y[l] = d * kMxfp4Doubled[qs[l] & 0xF];
    y[l + 16] = d * kMxfp4Doubled[qs[l] >> 4];
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
    case MXFP4: return dequantize_mxfp4;
    default: TORCH_CHECK(false, "GGML type ", type, " has no native kernel");
  }
  return nullptr;
}

QuantizedRows check_rows(const at::Tensor& qweight, int64_t type, int64_t cols) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte && qweight.is_contiguous(),
              "qweight must be a contiguous uint8 [rows, row_bytes] tensor");
  const BlockFormat format = block_format(type);
  TORCH_CHECK(cols % format.weights == 0, "K=", cols, " is not a multiple of the block size ", format.weights);
  TORCH_CHECK(qweight.size(1) == cols / format.weights * format.bytes, "qweight has ", qweight.size(1),
              " bytes per row; K=", cols, " of GGML type ", type, " needs ", cols / format.weights * format.bytes);
  return {qweight.data_ptr<uint8_t>(), qweight.size(0), cols, qweight.size(1), format, block_dequantizer(type)};
}

// sum_k w[k] * x[k], with four independent accumulators so the FMAs pipeline.
inline float row_dot(const float* w, const float* x, int64_t n) {
  constexpr int64_t kLanes = vec::kLanes;
  vec::Vec a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t k = 0;
  for (; k + 4 * kLanes <= n; k += 4 * kLanes) {
    a0 += vec::load(w + k) * vec::load(x + k);
    a1 += vec::load(w + k + kLanes) * vec::load(x + k + kLanes);
    a2 += vec::load(w + k + 2 * kLanes) * vec::load(x + k + 2 * kLanes);
    a3 += vec::load(w + k + 3 * kLanes) * vec::load(x + k + 3 * kLanes);
  }
  for (; k + kLanes <= n; k += kLanes) a0 += vec::load(w + k) * vec::load(x + k);
  float sum = vec::sum((a0 + a1) + (a2 + a3));
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

void dequantize_into(const QuantizedRows& w, int64_t first, int64_t count, float* out) {
  at::parallel_for(first, first + count, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) w.dequantize_row(n, out + (n - first) * w.cols);
  });
}


constexpr int64_t kTileFloats = int64_t{1} << 20;  // 4 MiB of dequantized weights per GEMM tile

}  // namespace

// x [B, K] float32; qweight [N, row_bytes] uint8 (N rows of GGML `type` blocks); returns x W^T, [B, N].
// activation_bits: 32 (float), 16 or 8 (integer activations at batch <= kDecodeMaxBatch where the type has
// that path; float otherwise).
at::Tensor gguf_matmul(const at::Tensor& x, const at::Tensor& qweight, int64_t type, int64_t activation_bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a float32 [B, K] tensor");
  TORCH_CHECK(activation_bits == 8 || activation_bits == 16 || activation_bits == 32,
              "activation_bits must be 8, 16 or 32, got ", activation_bits);
  const at::Tensor xc = x.contiguous();
  const QuantizedRows w = check_rows(qweight, type, xc.size(1));
  const int64_t batch = xc.size(0);
  at::Tensor y = at::empty({batch, w.rows}, xc.options());
  if (batch == 0) return y;
  if (type == F32 || type == F16) {
    row_invariant::matmul(xc.data_ptr<float>(), w.cols, batch, w.data, type == F32 ? at::kFloat : at::kHalf, w.rows,
                          w.cols, y.data_ptr<float>());
    return y;
  }
  if (batch <= kDecodeMaxBatch) {
    if (has_block_decode_path(type))
      matmul_decode_blocks(xc.data_ptr<float>(), batch, w, type, activation_bits, y.data_ptr<float>());
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
  m.def("gguf_matmul(Tensor x, Tensor qweight, int type, int activation_bits=32) -> Tensor", gguf_matmul);
  m.def("gguf_dequantize(Tensor qweight, int type, int cols) -> Tensor", gguf_dequantize);
}
