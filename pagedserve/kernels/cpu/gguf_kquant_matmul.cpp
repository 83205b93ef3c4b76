// K-quant weights (Q4_K, Q5_K, Q6_K) repacked at load 16 rows side by side and multiplied in integers by
// activations rounded per 256-value super-block (one float scale each, as llama.cpp's Q8_K) to 8 bits
// (llama.cpp's) or 15 (the 16-bit setting: two byte dots per quad), at every batch size, so a prefill chunk is
// an integer GEMM as much as a decode step is. A sub-block's dots are scaled by its integer scale in integers
// (gguf_kquant.h: SuperDots), so a super-block takes one float epilogue, not one per sub-block.
//
// Why repack: in the file's rows a super-block of 256 weights carries its own scales, and the row kernels
// spent more time unpacking and reducing than multiplying (a 1B-class Q4_K_M model decoded 9x slower than
// llama.cpp). Here one `vpdpbusd` multiplies four columns of 16 rows by four activation bytes broadcast to
// every lane: no horizontal sum, each weight byte loaded once per pass over the activation rows.
//
// Layout, per group of 16 rows (the last group padded with zero rows) and per 256-column super-block, a tile:
//   values: the unsigned integers u of the 256 columns by column quads c = 0..63; lane r (4 bytes) of quad c
//     holds row r's u at columns 4c..4c+3. Q4_K: quads 2p (low nibbles) and 2p+1 (high nibbles) share 64
//     bytes: 2048 bytes. Q5_K, Q6_K: a byte per value, 64 bytes per quad: 4096 bytes.
//   scales: int8 [sub-block][16 rows]: 8 sub-blocks of 32 columns, Q6_K 16 of 16;
//   mins: uint8 [8][16 rows] (Q4_K, Q5_K);
//   d, then dmin (Q4_K, Q5_K): fp16 [16 rows] each.
// Weights: d scale u - dmin min (Q4_K: u in 0..15, Q5_K: 0..31), d scale (u - 32) (Q6_K: u in 0..63), as
// ggml dequantizes them; only the values' storage differs from the file (Q5_K and Q6_K bytes instead of bit
// planes: 1.45x and 1.22x their bytes, for one load per quad). The values are AMX's weight tile layout too:
// where the CPU has AMX-INT8, whole 16-row chunks of activation rows take tile dot products instead
// (gguf_kquant_amx.cpp), with the same results to the bit.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "gguf_kquant.h"

using namespace gguf;          // NOLINT(build/namespaces): the shared declarations of gguf_blocks.h
using namespace gguf::kquant;  // NOLINT(build/namespaces): and of the K-quant kernels (gguf_kquant.h)

namespace {

using vec::Bytes;
using Words = uint16_t __attribute__((vector_size(sizeof(Vec))));

// Activation rows per pass over a group's tiles: their accumulators stay in registers.
constexpr int64_t kBatchChunk = vec::kLanes == 16 ? 8 : 4;

// One ggml super-block of `type` as integers: u[256], its sub-block scales and mins, d and dmin (fp16 bits).
struct SuperBlock {
  uint8_t u[kSuper];
  int8_t scales[16];
  uint8_t mins[8];
  uint16_t d, dmin;
};

SuperBlock unpack_super_block(int64_t type, const uint8_t* b) {
  SuperBlock s{};
  if (type == Q6_K) {
    const uint8_t *ql = b, *qh = b + 128;
    for (int n = 0; n < 2; ++n, ql += 64, qh += 32) {
      uint8_t* u = s.u + 128 * n;
      for (int l = 0; l < 32; ++l) {
        u[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
        u[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
        u[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
        u[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
      }
    }
    std::memcpy(s.scales, b + 192, 16);
    std::memcpy(&s.d, b + 208, 2);
    return s;
  }
  std::memcpy(&s.d, b, 2);
  std::memcpy(&s.dmin, b + 2, 2);
  const uint8_t* qh = b + 16;  // Q5_K's fifth bits
  const uint8_t* q = type == Q5_K ? b + 48 : b + 16;
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    scale_min_k4(j, b + 4, &scale, &min);
    s.scales[j] = static_cast<int8_t>(scale);
    s.mins[j] = static_cast<uint8_t>(min);
  }
  for (int chunk = 0; chunk < 4; ++chunk, q += 32)
    for (int l = 0; l < 32; ++l) {
      const int fifth_low = type == Q5_K ? ((qh[l] >> (2 * chunk)) & 1) << 4 : 0;
      const int fifth_high = type == Q5_K ? ((qh[l] >> (2 * chunk + 1)) & 1) << 4 : 0;
      s.u[64 * chunk + l] = (q[l] & 0xF) | fifth_low;
      s.u[64 * chunk + 32 + l] = (q[l] >> 4) | fifth_high;
    }
  return s;
}

// Row r's value at column k of a tile.
int tile_value(const uint8_t* t, bool nibbles, int64_t r, int64_t k) {
  const int64_t quad = k / 4, lane = kQuadBytes * (nibbles ? quad / 2 : quad) + 4 * r + k % 4;
  return nibbles ? (quad % 2 ? t[lane] >> 4 : t[lane] & 0xF) : t[lane];
}

void pack_row(int64_t type, const uint8_t* row, int64_t supers, int64_t r, uint8_t* tiles) {
  const TileFormat f = tile_format(type);
  const int64_t block_bytes = block_format(type).bytes;
  for (int64_t s = 0; s < supers; ++s) {
    const SuperBlock sb = unpack_super_block(type, row + s * block_bytes);
    uint8_t* t = tiles + s * f.bytes();
    for (int64_t k = 0; k < kSuper; ++k) {
      const int64_t quad = k / 4;
      if (f.nibbles)
        t[kQuadBytes * (quad / 2) + 4 * r + k % 4] |= quad % 2 ? sb.u[k] << 4 : sb.u[k];
      else
        t[kQuadBytes * quad + 4 * r + k % 4] = sb.u[k];
    }
    for (int64_t j = 0; j < f.sub_blocks; ++j) t[f.scales_at() + j * kTileRows + r] = sb.scales[j];
    std::memcpy(t + f.d_at() + 2 * r, &sb.d, 2);
    if (f.has_mins) {
      for (int64_t j = 0; j < 8; ++j) t[f.mins_at() + j * kTileRows + r] = sb.mins[j];
      std::memcpy(t + f.d_at() + 2 * kTileRows + 2 * r, &sb.dmin, 2);
    }
  }
}

// Row r of tile t (256 weights) in float32, as gguf_dequantize gives them: (d scale) u - dmin min, or
// (d scale) (u - 32).
void dequantize_tile_row(const uint8_t* t, int64_t type, int64_t r, float* out) {
  const TileFormat f = tile_format(type);
  const float d = half_at(t + f.d_at() + 2 * r);
  const float dmin = f.has_mins ? half_at(t + f.d_at() + 2 * kTileRows + 2 * r) : 0.f;
  const int64_t per_scale = kSuper / f.sub_blocks;
  for (int64_t k = 0; k < kSuper; ++k) {
    const int64_t j = k / per_scale;
    const float scaled = d * static_cast<int8_t>(t[f.scales_at() + j * kTileRows + r]);
    const int u = tile_value(t, f.nibbles, r, k);
    out[k] = f.has_mins ? scaled * u - dmin * t[f.mins_at() + j * kTileRows + r] : scaled * (u - 32);
  }
}

// Row `row` of x rounded per super-block into `a`: q = round(x (L / max|x|)), scale max|x| / L (L = 127 or
// 16383), as rounded_activations rounds (gguf_blocks.h), on vector lanes; with the sums the weights' type
// reads: per 32 values for a type with minimums (kMins), else per 16 (Q6_K's offsets). NOTE: that scalar
// loop took 3 ns a value here, more than the AMX matmul of a 2048-row matrix at batch 1024.
template <bool kSplit, bool kMins>
void round_row(const float* x, int64_t row, ByteActivations& a) {
  constexpr float kLargest = kSplit ? 16383.f : 127.f;
  constexpr int64_t kHalves = kSuper / 16, kVectors = 16 / vec::kLanes;  // per super-block, per half
  for (int64_t s = 0; s < a.cols / kSuper; ++s) {
    const float* xs = x + s * kSuper;
    Vec largest{}, poison{};  // poison: x * 0, NaN where x is not finite
    for (int64_t i = 0; i < kSuper; i += vec::kLanes) {
      const Vec v = vec::load(xs + i), magnitude = (Vec)((Quads)v & 0x7FFFFFFF);
      largest = largest > magnitude ? largest : magnitude;
      poison += v * 0.f;
    }
    float most = 0.f;
    for (int lane = 0; lane < vec::kLanes; ++lane) most = std::max(most, largest[lane]);
    // NOTE: a non-finite value makes the super-block's scale NaN (and its integers 0), as rounded_activations.
    const bool finite = vec::sum(poison) == 0.f;
    a.scales[row * (a.cols / kSuper) + s] = finite ? most / kLargest : std::numeric_limits<float>::quiet_NaN();
    const float inverse = finite && most > 0.f ? kLargest / most : 0.f;
    for (int64_t half = 0; half < kHalves; ++half) {
      const int64_t col = s * kSuper + 16 * half;
      int8_t *high = a.bytes_at(row, col, 0), *low = kSplit ? a.bytes_at(row, col, 1) : nullptr;
      int32_t high_sum = 0, low_sum = 0;
      for (int64_t v = 0; v < kVectors; ++v) {
        const Quads q = finite ? vec::round_to_quads(vec::load(xs + 16 * half + v * vec::kLanes) * inverse) : Quads{};
        const Quads q_high = kSplit ? q >> 7 : q;  // arithmetic: floor(q / 128)
        vec::store_low_bytes(high + v * vec::kLanes, q_high);
        high_sum += vec::sum(q_high);
        if constexpr (kSplit) {
          vec::store_low_bytes(low + v * vec::kLanes, q & 127);
          low_sum += vec::sum(q & 127);
        }
      }
      const int64_t at = row * (a.cols / 16) + col / 16;
      if constexpr (kMins) {
        a.sums[at / 2] += kSplit ? 128 * high_sum + low_sum : high_sum;
      } else {
        a.high_offsets[at] = 32 * high_sum;
        a.low_offsets[at] = 32 * low_sum;
      }
    }
  }
}

// x's rows as bytes, rows [0, tiled_rows) as AMX tiles, with the sums the weights' type reads (`mins`: it
// has minimums). NOTE: in parallel, by rows.
ByteActivations round_activations(const float* x, int64_t batch, int64_t cols, int64_t bits, int64_t tiled_rows,
                                  bool mins) {
  const bool split = bits != 8;
  const int64_t values = batch * cols, by_row = (batch - tiled_rows) * cols;
  ByteActivations a{batch,
                    cols,
                    split,
                    tiled_rows,
                    std::vector<int8_t>(by_row),
                    std::vector<int8_t>(split ? by_row : 0),
                    std::vector<int8_t>(tiled_rows * cols * (split ? 2 : 1)),
                    std::vector<float>(values / kSuper),
                    std::vector<int32_t>(mins ? values / kBlock : 0),
                    std::vector<int32_t>(mins ? 0 : values / 16),
                    std::vector<int32_t>(mins ? 0 : values / 16)};
  void (*const round)(const float*, int64_t, ByteActivations&) =
      split ? (mins ? round_row<true, true> : round_row<true, false>)
            : (mins ? round_row<false, true> : round_row<false, false>);
  constexpr int64_t kRowsPerTask = 4;
  at::parallel_for(0, batch, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) round(x + row * cols, row, a);
  });
  return a;
}

inline Quads in_every_lane(const int8_t* four) {
  int32_t bits;
  std::memcpy(&bits, four, sizeof bits);
  return Quads{} + bits;
}

inline Bytes load_bytes(const uint8_t* p) {
  Bytes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// dots[b][j] += the integer dots of quads [first, first + count) with activation row b's bytes x[b] (columns
// 4 quad on).
template <int64_t kType, int64_t kBatch>
__attribute__((always_inline)) inline void add_quads(const uint8_t* values, int64_t first, int64_t count,
                                                     const int8_t* const (&x)[kBatch],
                                                     Quads (&dots)[kBatch][kTileRegisters]) {
  constexpr int kRegisterBytes = 4 * vec::kLanes;
  if constexpr (kType == Q4_K) {
    for (int64_t p = first / 2; p < (first + count) / 2; ++p)
      for (int j = 0; j < kTileRegisters; ++j) {
        const Bytes both = load_bytes(values + kQuadBytes * p + kRegisterBytes * j);
        const Bytes low = both & 0x0F, high = (Bytes)((Words)both >> 4) & 0x0F;  // no byte shifts: words
        for (int64_t b = 0; b < kBatch; ++b) {
          dots[b][j] = vec::dot_quads(dots[b][j], low, (Bytes)in_every_lane(x[b] + 8 * p));
          dots[b][j] = vec::dot_quads(dots[b][j], high, (Bytes)in_every_lane(x[b] + 8 * p + 4));
        }
      }
  } else {
    for (int64_t c = first; c < first + count; ++c)
      for (int j = 0; j < kTileRegisters; ++j) {
        const Bytes u = load_bytes(values + kQuadBytes * c + kRegisterBytes * j);
        for (int64_t b = 0; b < kBatch; ++b)
          dots[b][j] = vec::dot_quads(dots[b][j], u, (Bytes)in_every_lane(x[b] + 4 * c));
      }
  }
}

// Sub-block `sub`'s integer dots into the super-block's: its high (and low) bytes' dots with the unsigned
// values (less 32 times the activations' sums for Q6_K), times the sub-block's scales. 8 bits: the one byte's
// into `low` (128 high + low is then the dot itself).
template <int64_t kType, int64_t kBatch, bool kSplit>
__attribute__((always_inline)) inline void add_sub_block(const uint8_t* t, int64_t sub, int64_t column,
                                                         const ByteActivations& a, int64_t first,
                                                         const int64_t (&at)[kBatch], SuperDots<kBatch>& dots) {
  constexpr TileFormat f = tile_format(kType);
  constexpr int64_t kQuads = f.columns_per_scale() / 4;
  Quads high[kBatch][kTileRegisters] = {}, low[kBatch][kTileRegisters] = {};
  const int8_t* x[kBatch];
  for (int64_t b = 0; b < kBatch; ++b) x[b] = a.high.data() + at[b];
  add_quads<kType, kBatch>(t, sub * kQuads, kQuads, x, high);
  if constexpr (kSplit) {
    for (int64_t b = 0; b < kBatch; ++b) x[b] = a.low.data() + at[b];
    add_quads<kType, kBatch>(t, sub * kQuads, kQuads, x, low);
  }
  const int64_t halves = a.cols / 16, half = first * halves + column / 16;
  for (int j = 0; j < kTileRegisters; ++j) {
    const auto* scales = reinterpret_cast<const int8_t*>(t + f.scales_at() + sub * kTileRows);
    const Quads scale = vec::bytes_to_quads(scales + j * vec::kLanes);
#pragma GCC unroll 16
    for (int64_t b = 0; b < kBatch; ++b) {
      if constexpr (!f.has_mins) high[b][j] -= a.high_offsets[half + b * halves];
      if constexpr (kSplit) {
        if constexpr (!f.has_mins) low[b][j] -= a.low_offsets[half + b * halves];
        dots.high[b][j] += high[b][j] * scale;
        dots.low[b][j] += low[b][j] * scale;
      } else {
        dots.low[b][j] += high[b][j] * scale;
      }
    }
  }
}

// The mins' dots of super-block s: each sub-block's min times the activations' sum over it.
template <int64_t kType, int64_t kBatch>
__attribute__((always_inline)) inline void add_mins(const uint8_t* t, int64_t s, const ByteActivations& a,
                                                    int64_t first, SuperDots<kBatch>& dots) {
  constexpr TileFormat f = tile_format(kType);
  for (int64_t sub = 0; sub < 8; ++sub) {
    const int64_t blocks = a.cols / kBlock;
    const int32_t* sums = a.sums.data() + first * blocks + s * 8 + sub;
    for (int j = 0; j < kTileRegisters; ++j) {
      const Quads min = vec::bytes_to_quads(t + f.mins_at() + sub * kTileRows + j * vec::kLanes);
#pragma GCC unroll 16
      for (int64_t b = 0; b < kBatch; ++b) dots.mins[b][j] += min * sums[b * blocks];
    }
  }
}

// Group g's rows of y for activation rows [first, first + kBatch).
template <int64_t kType, int64_t kBatch, bool kSplit>
void kquant_group(const ByteActivations& a, int64_t first, const uint8_t* packed, int64_t rows, int64_t cols,
                  int64_t g, float* y) {
  constexpr TileFormat f = tile_format(kType);
  const int64_t supers = cols / kSuper;
  const uint8_t* t = packed + g * supers * f.bytes();
  Vec acc[kBatch][kTileRegisters];
  for (auto& per_row : acc) std::fill(per_row, per_row + kTileRegisters, Vec{});
  for (int64_t s = 0; s < supers; ++s, t += f.bytes()) {
    prefetch_tile(t, f.bytes());
    int64_t at[kBatch];
    for (int64_t b = 0; b < kBatch; ++b) at[b] = (first + b - a.tiled_rows) * cols + s * kSuper;
    SuperDots<kBatch> dots{};
    for (int64_t sub = 0; sub < f.sub_blocks; ++sub)
      add_sub_block<kType, kBatch, kSplit>(t, sub, s * kSuper + sub * f.columns_per_scale(), a, first, at, dots);
    if constexpr (f.has_mins) add_mins<kType, kBatch>(t, s, a, first, dots);
    add_super_block<kType, kBatch>(t, s, a, first, dots, acc);
  }
  store_group<kBatch>(acc, first, rows, g, y);
}

// Each thread takes whole groups and runs every chunk of activation rows through a group before the next,
// so the group's tiles come from memory once and from cache for the later chunks (the cache blocking of a
// prefill GEMM: a group of a 2048-column Q4_K matrix is 18 KiB). AMX, where it runs, takes the whole 16-row
// chunks first (gguf_kquant_amx.cpp: a thread's groups in passes over rows that stay in L2), these dots the
// rows left.
template <int64_t kType, bool kSplit>
void kquant_matmul(const ByteActivations& a, int64_t batch, const uint8_t* packed, int64_t rows, int64_t cols,
                   float* y, const GroupSink& after_group) {
  // NOTE: split, twice the dot accumulators: 6 rows a pass on AVX-512 (4: 15% slower at batch 64; 8 spilled on
  // Q6_K), 3 on AVX2.
  constexpr int64_t kChunk = kSplit ? kBatchChunk * 3 / 4 : kBatchChunk;
  const int64_t groups = (rows + kTileRows - 1) / kTileRows, on_amx = a.tiled_rows;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    AmxTiles(kType, cols, on_amx).multiply(a, packed, rows, begin, end, y);
    for (int64_t g = begin; g < end; ++g) {
      for (int64_t first = on_amx; first < batch; first += kChunk)
        with_batch<kChunk>(std::min(kChunk, batch - first), [&](auto count) {
          kquant_group<kType, decltype(count)::value, kSplit>(a, first, packed, rows, cols, g, y);
        });
      if (after_group) after_group(g);
    }
  });
}

template <int64_t kType>
void kquant_matmul(const ByteActivations& a, int64_t batch, const uint8_t* packed, int64_t rows, int64_t cols,
                   float* y, const GroupSink& after_group) {
  if (!a.split) return kquant_matmul<kType, false>(a, batch, packed, rows, cols, y, after_group);
  kquant_matmul<kType, true>(a, batch, packed, rows, cols, y, after_group);
}

}  // namespace

namespace gguf {

bool is_k_quant(int64_t type) { return type == Q4_K || type == Q5_K || type == Q6_K; }

int64_t kquant_packed_bytes(int64_t type, int64_t rows, int64_t cols) {
  return (rows + kTileRows - 1) / kTileRows * (cols / kSuper) * tile_format(type).bytes();
}

at::Tensor kquant_pack(const at::Tensor& qweight, int64_t type) {
  const BlockFormat format = block_format(type);
  const int64_t rows = qweight.size(0), supers = qweight.size(1) / format.bytes;
  at::Tensor packed = at::zeros({kquant_packed_bytes(type, rows, supers * kSuper)}, qweight.options());
  const uint8_t* in = qweight.data_ptr<uint8_t>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  const int64_t group_bytes = supers * tile_format(type).bytes();
  // NOTE: by whole groups: the rows of a group write into the same bytes (nibbles are or-ed in).
  at::parallel_for(0, (rows + kTileRows - 1) / kTileRows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin * kTileRows; n < std::min(end * kTileRows, rows); ++n)
      pack_row(type, in + n * qweight.size(1), supers, n % kTileRows, out + n / kTileRows * group_bytes);
  });
  return packed;
}

void kquant_packed_matmul(const float* x, int64_t batch, const uint8_t* packed, int64_t type, int64_t rows,
                          int64_t cols, int64_t activation_bits, float* y, const GroupSink& after_group) {
  const ByteActivations a = round_activations(x, batch, cols, activation_bits, amx_rows(batch), type != Q6_K);
  switch (type) {
    case Q4_K: return kquant_matmul<Q4_K>(a, batch, packed, rows, cols, y, after_group);
    case Q5_K: return kquant_matmul<Q5_K>(a, batch, packed, rows, cols, y, after_group);
    default: return kquant_matmul<Q6_K>(a, batch, packed, rows, cols, y, after_group);
  }
}

void kquant_dequantize_row(const uint8_t* packed, int64_t type, int64_t cols, int64_t row, float* out) {
  const int64_t supers = cols / kSuper, bytes = tile_format(type).bytes();
  const uint8_t* t = packed + row / kTileRows * supers * bytes;
  for (int64_t s = 0; s < supers; ++s, t += bytes) dequantize_tile_row(t, type, row % kTileRows, out + s * kSuper);
}

}  // namespace gguf
