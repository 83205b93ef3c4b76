// Q4_0 / Q4_1 / Q8_0 weights repacked 16 rows side by side, so one vector instruction
// multiplies a pair of activations into 16 rows at once and no horizontal sum is ever needed.
//
// Why: the row-major kernel (gguf_decode_matmul.cpp) dots one row's 32-weight block at a time, then
// reduces and scales it per row: ~25 cycles per block on this project's CPUs, which made the matmuls of a
// one-user decode step compute-bound (11.9 ms for 96 MB of SmolLM2 weights). Here a tile of 16 rows x 32
// columns is 8 (Q4) or 16 (Q8_0) loads widened to int16 and 16 `vpdpwssd` per activation row: the same
// bytes, a few times less work. The same layout as llama.cpp's repacked CPU formats (rows interleaved
// so a vector holds one column of several rows); ours pairs columns for int16 dots. Batches of 16 rows and
// more take AMX tiles where the CPU has them (gguf_block_amx.cpp), with the same bits.
//
// Layout, per group of 16 rows (the last group padded with zero rows) and per 32-column block, one tile:
//   values: Q4: 8 chunks L of 32 bytes, byte 2r+j of chunk L = q[r][4L+j] | q[r][4L+2+j] << 4;
//           Q8_0: 16 chunks p of 32 bytes, byte 2r+j of chunk p = q[r][2p+j] (int8);
//   then the 16 rows' fp16 scales d, then (Q4_1 only) their fp16 minimums m.
// A group's tiles are consecutive. Tile bytes = 16 x the ggml block's: the packed copy replaces the rows,
// it is not a second copy. Weights are d q + m (Q4_1), d (q - 8) (Q4_0), d q (Q8_0).
#include "gguf_blocks.h"

#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

using namespace gguf;  // NOLINT(build/namespaces): the shared declarations of gguf_blocks.h

namespace {

// 8- and 16-bit activations are integers at every batch: a row's result is the same bits whatever shares its
// batch (decode steps, prefill chunks, both in one step). Q4_0 and Q4_1 batches of 16 rows and more go to
// AMX-BF16 tiles where the CPU has them (gguf_block_amx.cpp, bitwise equal to this kernel). NOTE: until
// 2026-12 prefill-sized batches (over 32 rows) computed on float32 activations, for the prompt logprobs'
// precision (16-bit blocks moved them by 1.02e-3 per value on SmolLM2, decode steps 3e-4 to 1.6e-3 alike);
// that made a token's logits depend on the size of its batch. With AVX-512 VNNI this kernel is ~2x ATen's
// float32 GEMM at every batch up to 2048; with AVX2 alone it was measured slower from batch 256 (SmolLM2's
// matrices, 2 threads): there a prefill pays for the same bits.

bool packable(int64_t type) { return type == Q4_0 || type == Q4_1 || type == Q8_0; }
int64_t packed_bytes(int64_t type, int64_t rows, int64_t cols);
int64_t values_bytes(int64_t type) { return type == Q8_0 ? 512 : 256; }
int64_t tile_bytes(int64_t type) { return kTileRows * block_format(type).bytes; }

// Weight k (0..31) of a ggml block's values, as an unsigned nibble (Q4) or a signed byte (Q8_0).
int block_value(int64_t type, const uint8_t* qs, int k) {
  if (type == Q8_0) return static_cast<int8_t>(qs[k]);
  return k < 16 ? qs[k] & 0xF : qs[k - 16] >> 4;
}

void check_packed(const at::Tensor& packed, int64_t type, int64_t rows, int64_t cols) {
  TORCH_CHECK(packable(type) || is_k_quant(type), "GGML type ", type,
              " has no packed layout (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K have)");
  const int64_t block = is_k_quant(type) ? 256 : kBlock;
  TORCH_CHECK(cols % block == 0, "K=", cols, " is not a multiple of ", block);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == packed_bytes(type, rows, cols),
              "packed must be the contiguous uint8 output of gguf_pack for ", rows, " rows of K=", cols);
}

int64_t packed_bytes(int64_t type, int64_t rows, int64_t cols) {
  if (is_k_quant(type)) return kquant_packed_bytes(type, rows, cols);
  return (rows + kTileRows - 1) / kTileRows * (cols / kBlock) * tile_bytes(type);
}

// Rows [first, first + count) of tile t (32 weights each) in float32, `stride` floats apart: the values
// gguf_dequantize gives for the file's rows. The 16 rows' integers are first untangled into q[row][column]
// (byte moves), so the float arithmetic runs over contiguous columns and vectorizes; scalar row by row it
// made a prefill-sized float matmul 1.7x slower than on the file's rows.
void dequantize_tile(const uint8_t* t, int64_t type, int64_t first, int64_t count, float* out, int64_t stride) {
  int8_t q[kTileRows][kBlock];
  if (type == Q8_0) {
    for (int p = 0; p < 16; ++p)
      for (int r = 0; r < kTileRows; ++r)
        for (int j = 0; j < 2; ++j) q[r][2 * p + j] = static_cast<int8_t>(t[32 * p + 2 * r + j]);
  } else {
    const int offset = type == Q4_0 ? 8 : 0;
    for (int chunk = 0; chunk < 8; ++chunk)
      for (int r = 0; r < kTileRows; ++r)
        for (int j = 0; j < 2; ++j) {
          const uint8_t byte = t[32 * chunk + 2 * r + j];
          q[r][4 * chunk + j] = static_cast<int8_t>((byte & 0xF) - offset);
          q[r][4 * chunk + 2 + j] = static_cast<int8_t>((byte >> 4) - offset);
        }
  }
  for (int64_t r = first; r < first + count; ++r) {
    // gguf_matmul.cpp's arithmetic: d q + m (Q4_1), d (q - 8) (Q4_0), d q (Q8_0); each product is exact
    // (an fp16 scale times a small integer), so a fused multiply-add rounds as the separate steps do.
    const float d = half_at(t + values_bytes(type) + 2 * r);
    const float m = type == Q4_1 ? half_at(t + values_bytes(type) + 32 + 2 * r) : 0.f;
    float* row = out + (r - first) * stride;
    for (int k = 0; k < kBlock; ++k) row[k] = d * static_cast<float>(q[r][k]) + m;
  }
}

// Rows [first, first + count) of a packed matrix in float32, row stride `cols`; `first` is a multiple of 16
// (whole groups).
void dequantize_packed_rows(const uint8_t* packed, int64_t type, int64_t cols, int64_t first, int64_t count,
                            float* out) {
  if (is_k_quant(type)) {
    for (int64_t row = first; row < first + count; ++row) kquant_dequantize_row(packed, type, cols, row, out + (row - first) * cols);
    return;
  }
  const int64_t blocks = cols / kBlock, tile = tile_bytes(type);
  for (int64_t row = first; row < first + count; row += kTileRows) {
    const uint8_t* t = packed + row / kTileRows * blocks * tile;
    const int64_t valid = std::min(kTileRows, first + count - row);
    for (int64_t i = 0; i < blocks; ++i, t += tile)
      dequantize_tile(t, type, 0, valid, out + (row - first) * cols + i * kBlock, cols);
  }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

using vec::Int16s, vec::Int32s, vec::Vec;

constexpr bool kHasPackedKernel = true;

// Activation rows per pass over a tile: their int32 dot accumulators stay in registers (one zmm each on
// AVX-512, two ymm each on AVX2's 16 registers, beside the widened weights). 8 rows on AVX2 spill and ran
// 7x slower than one row instead of ~2x.
constexpr int64_t kBatchChunk = vec::kLanes == 16 ? 8 : 4;

// A pair of int16 activations (read as one int32) in every lane pair.
inline Int16s pair_in_every_lane(const int32_t* pair) { return (Int16s)(Int32s{} + *pair); }

// One tile's integer dots with every activation row's block i: lane l of dots[b][j] = sum_k q[r][k] x[b][k]
// for row r = j * kLanes + l.
template <int64_t kType, int64_t kBatch>
__attribute__((always_inline)) inline void tile_dots(const uint8_t* values, const int32_t* const (&x)[kBatch],
                                                     Int32s (&dots)[kBatch][kTileRegisters]) {
  constexpr int kRegisterBytes = 2 * vec::kLanes;  // a register's rows' pairs of values
  for (auto& per_row : dots) std::fill(per_row, per_row + kTileRegisters, Int32s{});
  if constexpr (kType == Q8_0) {
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) {
      for (int j = 0; j < kTileRegisters; ++j) {
        const Int16s w = vec::widen_bytes(reinterpret_cast<const int8_t*>(values + 32 * p + kRegisterBytes * j));
        for (int64_t b = 0; b < kBatch; ++b) dots[b][j] = vec::dot_pairs(dots[b][j], w, pair_in_every_lane(x[b] + p));
      }
    }
  } else {
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      for (int j = 0; j < kTileRegisters; ++j) {
        const Int16s bytes = vec::widen_bytes(values + 32 * l + kRegisterBytes * j);
        constexpr int16_t kOffset = kType == Q4_0 ? 8 : 0;  // Q4_0's q - 8, signed: no term for the offset
        const Int16s low = (bytes & 0x0F) - kOffset, high = (bytes >> 4) - kOffset;
        for (int64_t b = 0; b < kBatch; ++b)
          dots[b][j] = vec::dot_pairs(vec::dot_pairs(dots[b][j], low, pair_in_every_lane(x[b] + 2 * l)), high,
                                      pair_in_every_lane(x[b] + 2 * l + 1));
      }
    }
  }
}

// Group g's rows of y for the activation rows [first, first + kBatch); a = the activations rounded to int16
// by 32-value block.
template <int64_t kType, int64_t kBatch>
void packed_group(const ActivationBlocks<int16_t>& a, int64_t first, const uint8_t* packed, int64_t rows,
                  int64_t cols, int64_t g, float* y) {
  const int64_t blocks = cols / kBlock, tile = tile_bytes(kType), scales_at = values_bytes(kType);
  const auto* pairs = reinterpret_cast<const int32_t*>(a.values) + first * cols / 2;
  const float* scales = a.scales.data() + first * blocks;
  const float* sums = a.sums.data() + first * blocks;
  const uint8_t* t = packed + g * blocks * tile;
  Vec acc[kBatch][kTileRegisters];
  for (auto& per_row : acc) std::fill(per_row, per_row + kTileRegisters, Vec{});
  for (int64_t i = 0; i < blocks; ++i, t += tile) {
    prefetch_tile(t, tile);
    const int32_t* x[kBatch];
    for (int64_t b = 0; b < kBatch; ++b) x[b] = pairs + (b * cols + i * kBlock) / 2;
    Int32s dots[kBatch][kTileRegisters];
    tile_dots<kType, kBatch>(t, x, dots);
    const auto* halves = reinterpret_cast<const c10::Half*>(t + scales_at);  // d, then (Q4_1) m of the rows
    for (int j = 0; j < kTileRegisters; ++j) {
      const Vec d = vec::load(halves + j * vec::kLanes);
      const Vec m = kType == Q4_1 ? vec::load(halves + kTileRows + j * vec::kLanes) : Vec{};
      for (int64_t b = 0; b < kBatch; ++b) {
        const int64_t at = b * blocks + i;
        acc[b][j] = vec::fma(vec::to_floats(dots[b][j]), d * scales[at], acc[b][j]);
        // Q4_1: sum_k (d q + m) x = d (sum_k q x) + m (sum_k x)
        if constexpr (kType == Q4_1) acc[b][j] = vec::fma(m, vec::splat(sums[at]), acc[b][j]);
      }
    }
  }
  store_group<kBatch>(acc, first, rows, g, y);
}

// Each thread takes whole groups; every chunk of activation rows goes through a group before the next group,
// so the group's tiles (6-18 KiB) are read from memory once and from L1 for the later chunks.
template <int64_t kType>
void packed_integer(const ActivationBlocks<int16_t>& a, int64_t batch, const uint8_t* packed, int64_t rows,
                    int64_t cols, float* y, const GroupSink& after_group) {
  const int64_t groups = (rows + kTileRows - 1) / kTileRows;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      for (int64_t first = 0; first < batch; first += kBatchChunk)
        with_batch<kBatchChunk>(std::min(kBatchChunk, batch - first), [&](auto count) {
          packed_group<kType, decltype(count)::value>(a, first, packed, rows, cols, g, y);
        });
      if (after_group) after_group(g);
    }
  });
}

void packed_integer_matmul(const float* x, int64_t batch, const uint8_t* packed, int64_t type, int64_t rows,
                           int64_t cols, int64_t activation_bits, float* y, const GroupSink& after_group) {
  const auto a = rounded_activations<int16_t>(x, batch, cols, activation_bits == 8 ? 127.f : 32767.f);
  switch (type) {
    case Q4_0: return packed_integer<Q4_0>(a, batch, packed, rows, cols, y, after_group);
    case Q4_1: return packed_integer<Q4_1>(a, batch, packed, rows, cols, y, after_group);
    default: return packed_integer<Q8_0>(a, batch, packed, rows, cols, y, after_group);
  }
}

#else  // no AVX2+FMA+F16C: the packed layout is never made (gguf_packable says no)

constexpr bool kHasPackedKernel = false;

void packed_integer_matmul(const float*, int64_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t, float*,
                           const GroupSink&) {
  TORCH_CHECK(false, "this build has no packed GGUF decode kernel");
}

#endif

}  // namespace

// Whether gguf_pack takes `type` in this build for activations of `activation_bits`: Q4_0, Q4_1 and Q8_0 for
// 8 or 16 (AVX2 builds), the K-quants for both (every build).
bool gguf_packable(int64_t type, int64_t activation_bits) {
  if (is_k_quant(type)) return activation_bits == 8 || activation_bits == 16;
  return kHasPackedKernel && packable(type) && (activation_bits == 8 || activation_bits == 16);
}

// qweight [N, row_bytes] uint8 rows of ggml `type` blocks -> the packed layout above (uint8, flat).
at::Tensor gguf_pack(const at::Tensor& qweight, int64_t type) {
  TORCH_CHECK(gguf_packable(type, 8), "GGML type ", type, " cannot be packed in this build");
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte, "qweight must be uint8 [rows, row_bytes]");
  const at::Tensor rows_in = qweight.contiguous();
  if (is_k_quant(type)) {
    TORCH_CHECK(rows_in.size(1) % block_format(type).bytes == 0, "row_bytes ", rows_in.size(1), " is not whole blocks");
    return kquant_pack(rows_in, type);
  }
  const BlockFormat format = block_format(type);
  const int64_t rows = rows_in.size(0), blocks = rows_in.size(1) / format.bytes;
  TORCH_CHECK(rows_in.size(1) % format.bytes == 0, "row_bytes ", rows_in.size(1), " is not whole blocks");
  const int64_t groups = (rows + kTileRows - 1) / kTileRows, tile = tile_bytes(type), scales_at = values_bytes(type);
  at::Tensor packed = at::zeros({groups * blocks * tile}, rows_in.options());
  const uint8_t* in = rows_in.data_ptr<uint8_t>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  const int64_t values_at = type == Q4_1 ? 4 : 2;  // after d (and m)
  at::parallel_for(0, rows, kTileRows, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t r = n % kTileRows;
      uint8_t* t = out + n / kTileRows * blocks * tile;
      for (int64_t i = 0; i < blocks; ++i, t += tile) {
        const uint8_t* block = in + n * rows_in.size(1) + i * format.bytes;
        for (int k = 0; k < kBlock; ++k) {
          const int q = block_value(type, block + values_at, k);
          if (type == Q8_0) {
            t[32 * (k / 2) + 2 * r + k % 2] = static_cast<uint8_t>(q);
          } else {
            t[32 * (k / 4) + 2 * r + k % 2] |= static_cast<uint8_t>(k % 4 < 2 ? q : q << 4);
          }
        }
        std::memcpy(t + scales_at + 2 * r, block, 2);                                  // d
        if (type == Q4_1) std::memcpy(t + scales_at + 32 + 2 * r, block + 2, 2);  // m
      }
    }
  });
  return packed;
}

// x checked (float32 [B, K], activation_bits 8, 16 or 32) and made contiguous; packed checked against it.
at::Tensor gguf::checked_packed_input(const at::Tensor& x, const at::Tensor& packed, int64_t type, int64_t rows,
                                      int64_t activation_bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a float32 [B, K] tensor");
  TORCH_CHECK(activation_bits == 8 || activation_bits == 16 || activation_bits == 32,
              "activation_bits must be 8, 16 or 32, got ", activation_bits);
  at::Tensor xc = x.contiguous();
  check_packed(packed, type, rows, xc.size(1));
  return xc;
}

// y [B, rows] = x W^T (x contiguous [B, K] float32, B > 0) on the path gguf_packed_matmul's comment gives;
// `after_group` is called on the integer paths off the AMX-BF16 block tiles. Returns whether it was.
bool gguf::packed_matmul_into(const at::Tensor& xc, const uint8_t* weights, int64_t type, int64_t rows,
                              int64_t activation_bits, const at::Tensor& y, const GroupSink& after_group) {
  const int64_t batch = xc.size(0), cols = xc.size(1);
  if (is_k_quant(type) && activation_bits != 32) {
    kquant_packed_matmul(xc.data_ptr<float>(), batch, weights, type, rows, cols, activation_bits, y.data_ptr<float>(),
                         after_group);
    return true;
  }
  if (block_amx_usable(type, batch, activation_bits)) {
    block_amx_matmul(xc.data_ptr<float>(), batch, weights, type, rows, cols, activation_bits, y.data_ptr<float>());
    return false;
  }
  if (activation_bits != 32) {
    packed_integer_matmul(xc.data_ptr<float>(), batch, weights, type, rows, cols, activation_bits, y.data_ptr<float>(),
                          after_group);
    return true;
  }
  // Each thread dequantizes a tile of rows (about 1 MiB, in L2) and multiplies it by x with a one-thread GEMM
  // (ATen's inside a parallel region). NOTE: not a parallel dequantization then ATen's parallel GEMM, tile
  // after tile: on 2 cores the hand-offs between the two left the threads spin-waiting most of the time (a
  // 16384 x 2048 matrix at batch 256 took 880 ms; 150 with OMP_WAIT_POLICY=passive).
  constexpr int64_t kTileFloats = int64_t{1} << 18;
  const int64_t tile_groups = std::max<int64_t>(1, kTileFloats / cols / kTileRows);
  const int64_t groups = (rows + kTileRows - 1) / kTileRows;
  // NOTE: the caller's inference mode, which the worker threads do not inherit: y is an inference tensor in
  // the engine, and an in-place copy into one outside inference mode raises.
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, groups, tile_groups, [&](int64_t begin, int64_t end) {
    const c10::InferenceMode inference_mode(inference);
    at::Tensor tile = at::empty({tile_groups * kTileRows, cols}, xc.options());
    for (int64_t group = begin; group < end; group += tile_groups) {
      const int64_t first = group * kTileRows;
      const int64_t count = std::min(std::min(group + tile_groups, end) * kTileRows, rows) - first;
      dequantize_packed_rows(weights, type, cols, first, count, tile.data_ptr<float>());
      y.narrow(1, first, count).copy_(at::mm(xc, tile.narrow(0, 0, count).t()));
    }
  });
  return false;
}


// x [B, K] float32 times the packed W^T (W [rows, K]) -> [B, rows]. activation_bits 8 or 16: integer dots on
// x rounded to 8 or 16 bits per 32-value block (K-quants: 8 or 15 bits per 256) at every B. 32: float32 x.
// B >= 16 on AMX-BF16 tiles where the CPU has them (gguf_block_amx.cpp: Q4_0 and Q4_1 on integers, all three
// on float32); float32 otherwise on tiles dequantized to float32 for ATen's GEMM.
at::Tensor gguf_packed_matmul(const at::Tensor& x, const at::Tensor& packed, int64_t type, int64_t rows,
                              int64_t activation_bits) {
  const at::Tensor xc = checked_packed_input(x, packed, type, rows, activation_bits);
  at::Tensor y = at::empty({xc.size(0), rows}, xc.options());
  if (xc.size(0) > 0) packed_matmul_into(xc, packed.data_ptr<uint8_t>(), type, rows, activation_bits, y);
  return y;
}

// Rows `ids` of a packed matrix (an embedding lookup) -> float32 [len(ids), K].
at::Tensor gguf_packed_rows(const at::Tensor& packed, int64_t type, int64_t rows, int64_t cols, const at::Tensor& ids) {
  check_packed(packed, type, rows, cols);
  const at::Tensor idc = ids.to(at::kLong).contiguous();
  const int64_t* index = idc.data_ptr<int64_t>();
  for (int64_t i = 0; i < idc.numel(); ++i)
    TORCH_CHECK(index[i] >= 0 && index[i] < rows, "row ", index[i], " is outside [0, ", rows, ")");
  at::Tensor out = at::empty({idc.numel(), cols}, packed.options().dtype(at::kFloat));
  const int64_t blocks = cols / kBlock, tile = tile_bytes(type);
  at::parallel_for(0, idc.numel(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (is_k_quant(type)) {
        kquant_dequantize_row(packed.data_ptr<uint8_t>(), type, cols, index[i], out.data_ptr<float>() + i * cols);
        continue;
      }
      const uint8_t* t = packed.data_ptr<uint8_t>() + index[i] / kTileRows * blocks * tile;
      for (int64_t block = 0; block < blocks; ++block, t += tile)
        dequantize_tile(t, type, index[i] % kTileRows, 1, out.data_ptr<float>() + i * cols + block * kBlock, cols);
    }
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  m.def("gguf_packable(int type, int activation_bits) -> bool", gguf_packable);
  m.def("gguf_pack(Tensor qweight, int type) -> Tensor", gguf_pack);
  m.def("gguf_packed_matmul(Tensor x, Tensor packed, int type, int rows, int activation_bits) -> Tensor",
        gguf_packed_matmul);
  m.def("gguf_packed_rows(Tensor packed, int type, int rows, int cols, Tensor ids) -> Tensor", gguf_packed_rows);
}
