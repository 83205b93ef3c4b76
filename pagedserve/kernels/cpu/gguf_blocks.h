// What the GGUF kernels share: ggml's block formats, fp16 fields, a weight matrix as rows of blocks, and the
// decode path for 32-weight blocks (gguf_decode_matmul.cpp) that gguf_matmul.cpp dispatches to.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "vec_int.h"

namespace gguf {

// ggml's type ids (gguf.GGMLQuantizationType).
enum GgmlType : int64_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14,
                        MXFP4 = 39 };

struct BlockFormat {
  int64_t weights;  // per block
  int64_t bytes;    // per block
};

inline BlockFormat block_format(int64_t type) {
  switch (type) {
    case F32: return {1, 4};
    case F16: return {1, 2};
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q8_0: return {32, 34};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    case MXFP4: return {32, 17};
    default: TORCH_CHECK(false, "GGML type ", type, " has no native kernel");
  }
  return {0, 0};
}

// An fp16 field of a block.
inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return vec::half_to_float(bits);
}

// 2^(e - 128): an MXFP4 block's E8M0 scale 2^(e - 127) halved, because its E2M1 values are taken doubled
// (integers, gguf_decode_matmul.cpp's table). Built from its bits so e 0 and 1 (subnormal) stay exact.
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// MXFP4's sixteen E2M1 codes doubled (0.5 steps become 1), by code: the low three bits the magnitude, bit 3
// the sign.
constexpr int8_t kMxfp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

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

using BlockDequantizer = void (*)(const uint8_t*, float*);

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

constexpr int64_t kBlock = 32;  // weights per Q4_0/Q4_1/Q8_0/MXFP4 block or K-quant sub-block; per activation block

// Activation rows by 32-value block: x[b, k] ~ scales[b, k / 32] * values[b, k].
template <typename Value>
struct ActivationBlocks {
  const Value* values;         // [batch, cols]: x itself (float), or `rounded`
  std::vector<Value> rounded;  // the integers, for 8 and 16 bits
  std::vector<float> scales;   // [batch, blocks]: 1 for float
  std::vector<float> sums;     // [batch, blocks]: the block's sum of x as `values` give it (for weight offsets)
};

inline ActivationBlocks<float> float_activations(const float* x, int64_t batch, int64_t cols) {
  const int64_t blocks = batch * cols / kBlock;
  ActivationBlocks<float> out{x, {}, std::vector<float>(blocks, 1.f), std::vector<float>(blocks)};
  for (int64_t i = 0; i < blocks; ++i) {
    float sum = 0.f;
    for (int64_t j = 0; j < kBlock; ++j) sum += x[i * kBlock + j];
    out.sums[i] = sum;
  }
  return out;
}

// `largest_integer`: the integers' bound, Int's largest by default (127 or 32767: -128 / -32768 never used);
// 127 in int16 storage gives 8-bit values to a 16-bit kernel.
template <typename Int>
inline ActivationBlocks<Int> rounded_activations(const float* x, int64_t batch, int64_t cols,
                                                float largest_integer = std::numeric_limits<Int>::max()) {
  const int64_t blocks = batch * cols / kBlock;
  ActivationBlocks<Int> out{nullptr, std::vector<Int>(batch * cols), std::vector<float>(blocks),
                            std::vector<float>(blocks)};
  out.values = out.rounded.data();
  // NOTE: in parallel where a call has prefill-sized batches (a decode step's few blocks stay on this thread).
  constexpr int64_t kBlocksPerTask = 256;
  at::parallel_for(0, blocks, kBlocksPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xb = x + i * kBlock;
      Int* q = out.rounded.data() + i * kBlock;
      float largest = 0.f;
      bool finite = true;
      for (int64_t j = 0; j < kBlock; ++j) {
        largest = std::max(largest, std::fabs(xb[j]));
        finite = finite && std::isfinite(xb[j]);
      }
      // NOTE: a non-finite value makes the block's scale NaN (and its integers 0), so the outputs it touches
      // are NaN as the float path's would be non-finite, instead of an undefined float-to-int conversion.
      const float scale = finite ? largest / largest_integer : std::numeric_limits<float>::quiet_NaN();
      const float inverse = finite && largest > 0.f ? largest_integer / largest : 0.f;
      int32_t sum = 0;
      for (int64_t j = 0; j < kBlock; ++j) {
        q[j] = static_cast<Int>(std::nearbyint(finite ? xb[j] * inverse : 0.f));
        sum += q[j];
      }
      out.scales[i] = scale;
      out.sums[i] = scale * static_cast<float>(sum);
    }
  });
  return out;
}

// Batches up to this size take the decode paths (each weight byte read once per call, accumulators in
// registers); larger ones amortize a dequantized tile over enough rows for ATen's GEMM to win.
constexpr int64_t kDecodeMaxBatch = 8;

// Whether `matmul_decode_blocks` takes weights of `type` in this build (Q4_0, Q4_1, Q8_0, MXFP4, Q4_K, Q5_K with
// AVX2+FMA).
bool has_block_decode_path(int64_t type);

// y [batch, rows] = x [batch, cols] W^T for batch <= kDecodeMaxBatch. `activation_bits` 32: on x's float
// values; 8 or 16: each 32-value block of x rounded to integers of that width (one scale per block) and
// dotted with the weight blocks in integers.
void matmul_decode_blocks(const float* x, int64_t batch, const QuantizedRows& w, int64_t type,
                          int64_t activation_bits, float* y);

// ---- what the packed kernels (16 weight rows side by side) share ----
constexpr int64_t kTileRows = 16;
constexpr int kTileRegisters = kTileRows / vec::kLanes;  // one (AVX-512) or two vectors hold 16 lanes

// Asks for the tiles ahead while this one is computed: about 4.5 KiB past `tile` into L2, the next tile into
// L1. The packed kernels read their tiles in order, and the hardware prefetcher alone left a decode step's
// matmuls at half the memory bandwidth (a 1B-class Q4_K matrix, 2 threads, AMD EPYC: 20 GB/s without, 47
// with, L1 only; 4 tiles ahead: 31-37). On a Xeon, prefetching into L1 alone gave 13.8 GB/s, two levels 18.1
// (L2 takes more misses in flight than L1's few fill buffers; as paged_attention.cpp's blocks).
inline void prefetch_tile(const uint8_t* tile, int64_t bytes) {
  constexpr int64_t kAhead = 4608, kLine = 64;
  constexpr int kL2 = 2, kL1 = 3;  // __builtin_prefetch's locality: prefetcht1, prefetcht0
  const int64_t ahead = (kAhead + bytes - 1) / bytes * bytes;
  for (int64_t line = 0; line < bytes; line += kLine) {
    __builtin_prefetch(tile + ahead + line, 0, kL2);
    __builtin_prefetch(tile + bytes + line, 0, kL1);
  }
}

// fn(std::integral_constant<int64_t, count>{}) for count in 1..kMax: one compiled kernel per number of
// activation rows, so their accumulators are arrays of known size (registers).
template <int64_t kMax, int64_t kBatch = 1, typename Fn>
inline void with_batch(int64_t count, Fn&& fn) {
  if constexpr (kBatch < kMax) {
    if (count != kBatch) return with_batch<kMax, kBatch + 1>(count, std::forward<Fn>(fn));
  }
  fn(std::integral_constant<int64_t, kBatch>{});
}

// Group g's 16 rows of y [batch, rows] for activation rows [first, first + kBatch) from a packed kernel's
// accumulators; the padded last group's extra lanes are dropped.
template <int64_t kBatch>
inline void store_group(const vec::Vec (&acc)[kBatch][kTileRegisters], int64_t first, int64_t rows, int64_t g,
                        float* y) {
  const int64_t row = g * kTileRows, valid = std::min(kTileRows, rows - row);
#pragma GCC unroll 16  // NOTE: as early as add_sub_block's (gguf_kquant.h), to keep acc in registers
  for (int64_t b = 0; b < kBatch; ++b) {
    float lanes[kTileRows];
    float* out = valid == kTileRows ? y + (first + b) * rows + row : lanes;
    for (int j = 0; j < kTileRegisters; ++j) vec::store(out + j * vec::kLanes, acc[b][j]);
    if (out == lanes) std::memcpy(y + (first + b) * rows + row, lanes, valid * sizeof(float));
  }
}

// Called by a packed kernel's thread once it has written group g's 16 rows of y for every activation row, while
// they are still in L1: the LM head's fused argmax (gguf_packed_matmul.cpp). A thread's groups come in
// increasing order. Empty: nothing to call.
using GroupSink = std::function<void(int64_t g)>;

// The packed matmul's entry, shared by gguf_packed_matmul and the LM head's greedy variant
// (gguf_packed_greedy.cpp): x checked (float32 [B, K], activation_bits 8, 16 or 32) and made contiguous, and
// `packed` checked against it; then y [B, rows] = x W^T (B > 0) on gguf_packed_matmul's path, calling
// `after_group` on the integer paths off the AMX-BF16 block tiles. Returns whether it was called.
at::Tensor checked_packed_input(const at::Tensor& x, const at::Tensor& packed, int64_t type, int64_t rows,
                                int64_t activation_bits);
bool packed_matmul_into(const at::Tensor& xc, const uint8_t* weights, int64_t type, int64_t rows,
                        int64_t activation_bits, const at::Tensor& y, const GroupSink& after_group = {});

// K-quants (Q4_K, Q5_K, Q6_K) in the 16-row packed layout of gguf_kquant_matmul.cpp, multiplied on integer
// activation blocks (activation_bits 8, or 16: 15-bit blocks) at every batch size.
bool is_k_quant(int64_t type);
int64_t kquant_packed_bytes(int64_t type, int64_t rows, int64_t cols);
at::Tensor kquant_pack(const at::Tensor& qweight, int64_t type);  // qweight: contiguous [rows, row_bytes]
void kquant_packed_matmul(const float* x, int64_t batch, const uint8_t* packed, int64_t type, int64_t rows,
                          int64_t cols, int64_t activation_bits, float* y, const GroupSink& after_group = {});
void kquant_dequantize_row(const uint8_t* packed, int64_t type, int64_t cols, int64_t row, float* out);

// Q4_0, Q4_1, Q8_0 in the 16-row packed layout with AMX-BF16 tiles (gguf_block_amx.cpp), on integer
// activation blocks (activation_bits 8, 16: the VNNI kernel's bits; Q4_0 and Q4_1) or float32 (32): whether
// it takes this batch here, and y [batch, rows] = x W^T.
bool block_amx_usable(int64_t type, int64_t batch, int64_t activation_bits);
void block_amx_matmul(const float* x, int64_t batch, const uint8_t* packed, int64_t type, int64_t rows,
                      int64_t cols, int64_t activation_bits, float* y);

}  // namespace gguf
