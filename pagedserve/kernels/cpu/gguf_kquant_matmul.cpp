// K-quant weights (Q4_K, Q5_K, Q6_K) repacked at load 16 rows side by side and multiplied in integers by
// activations rounded per 32-value block (one float scale each) to 8 bits (llama.cpp's) or 15 (the 16-bit
// setting: two byte dots per quad), at every batch size, so a prefill chunk is an integer GEMM as much as a
// decode step is.
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
// planes: 1.45x and 1.22x their bytes, for one load per quad).
#include "gguf_blocks.h"

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstring>

using namespace gguf;  // NOLINT(build/namespaces): the shared declarations of gguf_blocks.h

namespace {

using vec::Bytes, vec::Quads, vec::Vec;
using Words = uint16_t __attribute__((vector_size(sizeof(Vec))));

constexpr int64_t kSuper = 256;
constexpr int64_t kQuadBytes = 4 * kTileRows;
// Activation rows per pass over a group's tiles: their accumulators stay in registers.
constexpr int64_t kBatchChunk = vec::kLanes == 16 ? 8 : 4;

struct TileFormat {
  bool nibbles;        // Q4_K: two quads per 64 bytes
  int64_t sub_blocks;  // scales per row and super-block
  bool has_mins;
  int64_t values_bytes() const { return nibbles ? 2048 : 4096; }
  int64_t scales_at() const { return values_bytes(); }
  int64_t mins_at() const { return scales_at() + sub_blocks * kTileRows; }
  int64_t d_at() const { return mins_at() + (has_mins ? 8 * kTileRows : 0); }
  int64_t bytes() const { return d_at() + (has_mins ? 4 : 2) * kTileRows; }
};

constexpr TileFormat tile_format(int64_t type) {
  return type == Q4_K ? TileFormat{true, 8, true} : type == Q5_K ? TileFormat{false, 8, true} : TileFormat{false, 16, false};
}

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

// The activations as bytes for `vpdpbusd`: per 32-value block integers q and a scale (x ~ scale q). 8 bits: q
// in [-127, 127], one byte (`high`). 15 bits: q in [-16383, 16383] split as 128 high + low (high in
// [-128, 127], low in [0, 127]): two byte dots per quad, for 16-bit-class precision on the same instruction.
struct ByteActivations {
  std::vector<int8_t> high, low;   // [batch, cols]; low: 15 bits only
  std::vector<float> scales, sums;  // [batch, cols / 32]: the block's scale, and its sum scale * sum(q)
  std::vector<int32_t> half_sums;  // [batch, cols / 16]: sum(q) of each half block (Q6_K's offset)
};

template <typename Int>
ByteActivations split_activations(ActivationBlocks<Int> blocks, int64_t values) {
  ByteActivations a{std::vector<int8_t>(values), {}, std::move(blocks.scales), std::move(blocks.sums),
                    std::vector<int32_t>(values / 16)};
  if constexpr (sizeof(Int) == 2) a.low.resize(values);
  for (int64_t i = 0; i < values; ++i) {
    const int32_t q = blocks.rounded[i];
    a.high[i] = static_cast<int8_t>(sizeof(Int) == 2 ? q >> 7 : q);  // arithmetic shift: floor(q / 128)
    if constexpr (sizeof(Int) == 2) a.low[i] = static_cast<int8_t>(q & 127);
    a.half_sums[i / 16] += q;
  }
  return a;
}

ByteActivations round_activations(const float* x, int64_t batch, int64_t cols, int64_t bits) {
  if (bits == 8) return split_activations(rounded_activations<int8_t>(x, batch, cols), batch * cols);
  return split_activations(rounded_activations<int16_t>(x, batch, cols, 16383.f), batch * cols);
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

// Sub-block `sub`'s integer dots: 8 bits one byte dot per quad, 15 bits two (128 high + low).
template <int64_t kType, int64_t kBatch, bool kSplit>
__attribute__((always_inline)) inline void sub_block_dots(const uint8_t* t, int64_t first_quad, int64_t quads,
                                                          const ByteActivations& a, const int64_t (&at)[kBatch],
                                                          Quads (&dots)[kBatch][kTileRegisters]) {
  const int8_t* x[kBatch];
  for (int64_t b = 0; b < kBatch; ++b) x[b] = a.high.data() + at[b];
  add_quads<kType, kBatch>(t, first_quad, quads, x, dots);
  if constexpr (kSplit) {
    Quads low[kBatch][kTileRegisters] = {};
    for (int64_t b = 0; b < kBatch; ++b) x[b] = a.low.data() + at[b];
    add_quads<kType, kBatch>(t, first_quad, quads, x, low);
    for (int64_t b = 0; b < kBatch; ++b)
      for (int j = 0; j < kTileRegisters; ++j) dots[b][j] = (dots[b][j] << 7) + low[b][j];
  }
}

// Group g's rows of y for activation rows [first, first + kBatch).
template <int64_t kType, int64_t kBatch, bool kSplit>
void kquant_group(const ByteActivations& a, int64_t first, const uint8_t* packed, int64_t rows, int64_t cols,
                  int64_t g, float* y) {
  constexpr TileFormat f = tile_format(kType);
  constexpr int64_t kPerScale = kSuper / f.sub_blocks;  // 32 or 16 columns
  const int64_t supers = cols / kSuper, blocks = cols / kBlock;
  const uint8_t* t = packed + g * supers * f.bytes();
  Vec acc[kBatch][kTileRegisters];
  for (auto& per_row : acc) std::fill(per_row, per_row + kTileRegisters, Vec{});
  for (int64_t s = 0; s < supers; ++s, t += f.bytes()) {
    prefetch_tile(t, f.bytes());
    Vec d[kTileRegisters], dmin[kTileRegisters];
    for (int j = 0; j < kTileRegisters; ++j) {
      d[j] = vec::load(reinterpret_cast<const c10::Half*>(t + f.d_at()) + j * vec::kLanes);
      if constexpr (f.has_mins) dmin[j] = vec::load(reinterpret_cast<const c10::Half*>(t + f.d_at() + 32) + j * vec::kLanes);
    }
    for (int64_t sub = 0; sub < f.sub_blocks; ++sub) {
      const int64_t column = s * kSuper + sub * kPerScale, block = column / kBlock;
      int64_t at[kBatch];
      for (int64_t b = 0; b < kBatch; ++b) at[b] = (first + b) * cols + s * kSuper;
      Quads dots[kBatch][kTileRegisters] = {};
      sub_block_dots<kType, kBatch, kSplit>(t, sub * kPerScale / 4, kPerScale / 4, a, at, dots);
      for (int j = 0; j < kTileRegisters; ++j) {
        const Vec scale = d[j] * vec::bytes_to_floats(reinterpret_cast<const int8_t*>(t + f.scales_at() + sub * kTileRows) + j * vec::kLanes);
        for (int64_t b = 0; b < kBatch; ++b) {
          const int64_t at = (first + b) * blocks + block;
          Quads dot = dots[b][j];
          if constexpr (!f.has_mins) dot -= 32 * a.half_sums[(first + b) * cols / 16 + column / 16];  // u - 32
          acc[b][j] = vec::fma(vec::to_floats(dot), scale * a.scales[at], acc[b][j]);
        }
        if constexpr (f.has_mins) {
          const Vec min = dmin[j] * vec::bytes_to_floats(t + f.mins_at() + sub * kTileRows + j * vec::kLanes);
          for (int64_t b = 0; b < kBatch; ++b)
            acc[b][j] = vec::fma(min, vec::splat(-a.sums[(first + b) * blocks + block]), acc[b][j]);
        }
      }
    }
  }
  store_group<kBatch>(acc, first, rows, g, y);
}

// Each thread takes whole groups and runs every chunk of activation rows through a group before the next,
// so the group's tiles come from memory once and from cache for the later chunks (the cache blocking of a
// prefill GEMM: a group of a 2048-column Q4_K matrix is 18 KiB).
template <int64_t kType, bool kSplit>
void kquant_matmul(const ByteActivations& a, int64_t batch, const uint8_t* packed, int64_t rows, int64_t cols,
                   float* y) {
  // NOTE: split, twice the dot accumulators: 6 rows a pass on AVX-512 (4: 15% slower at batch 64; 8 spilled on
  // Q6_K), 3 on AVX2.
  constexpr int64_t kChunk = kSplit ? kBatchChunk * 3 / 4 : kBatchChunk;
  const int64_t groups = (rows + kTileRows - 1) / kTileRows;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      for (int64_t first = 0; first < batch; first += kChunk)
        with_batch<kChunk>(std::min(kChunk, batch - first), [&](auto count) {
          kquant_group<kType, decltype(count)::value, kSplit>(a, first, packed, rows, cols, g, y);
        });
  });
}

template <int64_t kType>
void kquant_matmul(const ByteActivations& a, int64_t batch, const uint8_t* packed, int64_t rows, int64_t cols,
                   float* y) {
  if (a.low.empty()) return kquant_matmul<kType, false>(a, batch, packed, rows, cols, y);
  kquant_matmul<kType, true>(a, batch, packed, rows, cols, y);
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
                          int64_t cols, int64_t activation_bits, float* y) {
  const ByteActivations a = round_activations(x, batch, cols, activation_bits);
  switch (type) {
    case Q4_K: return kquant_matmul<Q4_K>(a, batch, packed, rows, cols, y);
    case Q5_K: return kquant_matmul<Q5_K>(a, batch, packed, rows, cols, y);
    default: return kquant_matmul<Q6_K>(a, batch, packed, rows, cols, y);
  }
}

void kquant_dequantize_row(const uint8_t* packed, int64_t type, int64_t cols, int64_t row, float* out) {
  const int64_t supers = cols / kSuper, bytes = tile_format(type).bytes();
  const uint8_t* t = packed + row / kTileRows * supers * bytes;
  for (int64_t s = 0; s < supers; ++s, t += bytes) dequantize_tile_row(t, type, row % kTileRows, out + s * kSuper);
}

}  // namespace gguf
