// What the K-quant matmul's two ways of taking integer dots share (gguf_kquant_matmul.cpp: the packed layout,
// AVX-512 VNNI / AVX2 dots; gguf_kquant_amx.cpp: AMX tiles for whole 16-row chunks of activation rows): the
// tile format, the activations as bytes, and the float epilogue of a sub-block, so both paths scale the same
// exact integer dots by the same float operations in the same order and give bitwise equal results.
#pragma once

#include "gguf_blocks.h"

namespace gguf::kquant {

using vec::Quads, vec::Vec;

constexpr int64_t kSuper = 256;
constexpr int64_t kQuadBytes = 4 * kTileRows;

struct TileFormat {
  bool nibbles;        // Q4_K: two quads per 64 bytes
  int64_t sub_blocks;  // scales per row and super-block
  bool has_mins;
  constexpr int64_t values_bytes() const { return nibbles ? 2048 : 4096; }
  constexpr int64_t scales_at() const { return values_bytes(); }
  constexpr int64_t mins_at() const { return scales_at() + sub_blocks * kTileRows; }
  constexpr int64_t d_at() const { return mins_at() + (has_mins ? 8 * kTileRows : 0); }
  constexpr int64_t bytes() const { return d_at() + (has_mins ? 4 : 2) * kTileRows; }
  constexpr int64_t columns_per_scale() const { return kSuper / sub_blocks; }  // 32, Q6_K 16
};

constexpr TileFormat tile_format(int64_t type) {
  return type == Q4_K ? TileFormat{true, 8, true} : type == Q5_K ? TileFormat{false, 8, true} : TileFormat{false, 16, false};
}

// The activations as bytes for `vpdpbusd` (and AMX's `tdpbsud`): per 32-value block integers q and a scale
// (x ~ scale q). 8 bits: q in [-127, 127], one byte (`high`). 15 bits: q in [-16383, 16383] split as
// 128 high + low (high in [-128, 127], low in [0, 127]): two byte dots per quad, for 16-bit-class precision on
// the same instruction.
struct ByteActivations {
  int64_t batch;
  std::vector<int8_t> high, low;  // [batch, cols]; low: 15 bits only
  // Per block, the rows side by side (a sub-block's scaling reads them in a row):
  std::vector<float> scales, sums;  // [cols / 32, batch]: the block's scale, and its sum scale * sum(q)
  std::vector<int32_t> offsets;     // [cols / 16, batch]: 32 sum(q) of each half block (Q6_K's u - 32)
};

// A tile's d and dmin (fp16 per row) as floats.
struct SuperScales {
  Vec d[kTileRegisters], dmin[kTileRegisters];
};

template <int64_t kType>
__attribute__((always_inline)) inline SuperScales super_scales(const uint8_t* t) {
  constexpr TileFormat f = tile_format(kType);
  SuperScales s{};
  for (int j = 0; j < kTileRegisters; ++j) {
    s.d[j] = vec::load(reinterpret_cast<const c10::Half*>(t + f.d_at()) + j * vec::kLanes);
    if constexpr (f.has_mins) s.dmin[j] = vec::load(reinterpret_cast<const c10::Half*>(t + f.d_at() + 32) + j * vec::kLanes);
  }
  return s;
}

// acc[b] += sub-block `sub` of tile t (columns from `column`) given the integer dots of activation rows
// [first, first + kBatch) with its 16 rows: (d scale) (dot - offset) times the activation block's scale for
// Q6_K, else (d scale) dot times it - (dmin min) sum. NOTE: the row loops are unrolled from the start (GCC's
// own unrolling comes after its scalar replacement of arrays): at 16 rows a loop left whole keeps the
// caller's accumulators in memory, a load and a store around every multiply-add.
template <int64_t kType, int64_t kBatch>
__attribute__((always_inline)) inline void add_sub_block(const uint8_t* t, const SuperScales& ss, int64_t sub,
                                                         int64_t column, const ByteActivations& a, int64_t first,
                                                         const Quads (&dots)[kBatch][kTileRegisters],
                                                         Vec (&acc)[kBatch][kTileRegisters]) {
  constexpr TileFormat f = tile_format(kType);
  const int64_t at = column / kBlock * a.batch + first;
  const float *scales = a.scales.data() + at, *sums = a.sums.data() + at;
  const int32_t* offsets = a.offsets.data() + column / 16 * a.batch + first;
  for (int j = 0; j < kTileRegisters; ++j) {
    const Vec scale = ss.d[j] * vec::bytes_to_floats(reinterpret_cast<const int8_t*>(t + f.scales_at() + sub * kTileRows) + j * vec::kLanes);
#pragma GCC unroll 16
    for (int64_t b = 0; b < kBatch; ++b) {
      Quads dot = dots[b][j];
      if constexpr (!f.has_mins) dot -= offsets[b];  // u - 32
      acc[b][j] = vec::fma(vec::to_floats(dot), scale * scales[b], acc[b][j]);
    }
    if constexpr (f.has_mins) {
      // NOTE: (-min) sum, not min (-sum): the same product, its negation on one vector instead of every row's.
      const Vec minus_min = -(ss.dmin[j] * vec::bytes_to_floats(t + f.mins_at() + sub * kTileRows + j * vec::kLanes));
#pragma GCC unroll 16
      for (int64_t b = 0; b < kBatch; ++b) acc[b][j] = vec::fma(minus_min, vec::splat(sums[b]), acc[b][j]);
    }
  }
}

// ---- the AMX path (gguf_kquant_amx.cpp) ----

// The activation rows AMX takes out of `batch`: whole 16-row chunks from row 0, when the build has AMX-INT8,
// the process got the tile state, it is switched on (gguf_set_amx) and the batch is large enough; else 0.
int64_t amx_rows(int64_t batch);

// One thread's AMX tiles for a K-quant type, configured on construction and released on destruction (tile
// state is per thread: each at::parallel_for chunk holds its own), with the scratch a Q4_K group's values are
// unpacked into (AMX reads one byte per value).
class AmxTiles {
 public:
  AmxTiles(int64_t type, int64_t cols, int64_t amx_rows);
  ~AmxTiles();
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
  // Group g's rows of y for activation rows [0, amx_rows).
  void multiply(const ByteActivations& a, const uint8_t* packed, int64_t rows, int64_t g, float* y);

 private:
  int64_t type_, cols_, amx_rows_;
  std::vector<uint8_t> unpacked_;
};

}  // namespace gguf::kquant
