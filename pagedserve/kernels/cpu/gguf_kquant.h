// What the K-quant matmul's two ways of taking integer dots share (gguf_kquant_matmul.cpp: the packed layout,
// AVX-512 VNNI / AVX2 dots; gguf_kquant_amx.cpp: AMX tiles for whole 16-row chunks of activation rows): the
// tile format, the activations as bytes, and the float epilogue of a sub-block, so both paths scale the same
// exact integer dots by the same float operations in the same order and give bitwise equal results.
#pragma once

#include <optional>

#include "amx.h"
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

// The activations as bytes for `vpdpbusd` (and AMX's tile dots): per 256-value super-block integers q and one
// float scale (x ~ scale q). 8 bits: q in [-127, 127], one byte (`high`). 15 bits: q in [-16383, 16383] split
// as 128 high + low (high in [-128, 127], low in [0, 127]): two byte dots per quad, for 16-bit-class precision
// on the same instructions. NOTE: one scale per super-block, as llama.cpp's Q8_K, not per 32 values: the
// weights' integer sub-block scales then fold into integer sums, and a super-block's dots leave the integers
// once (the float epilogue per 32 columns was most of a prefill matmul's time).
struct ByteActivations {
  int64_t batch, cols;
  bool split;          // 15 bits: high and low bytes
  int64_t tiled_rows;  // rows [0, tiled_rows) go to AMX, as `tiles`; the others are `high` and `low`
  // Rows [tiled_rows, batch) by row: [batch - tiled_rows, cols]; low: 15 bits only.
  std::vector<int8_t> high, low;
  // The AMX rows' bytes as tiles: per 16-row chunk and 64-column step, 16 rows of 64 high bytes, then (15
  // bits) of 64 low bytes. NOTE: rows a power of two apart (cols bytes) fell in a few cache sets and missed:
  // 1.5-2x slower at batch 256.
  std::vector<int8_t> tiles;
  // By row. NOTE: not rows side by side: the rounding writes a row at a time, and a write 4 KiB from the last
  // missed the cache (at batch 1024, most of the rounding's time).
  std::vector<float> scales;          // [batch, cols / 256]
  // Types with minimums (Q4_K, Q5_K): [batch, cols / 32]: sum(q) of each 32 values (the mins' term).
  std::vector<int32_t> sums;
  // Q6_K: [batch, cols / 16]: 32 sum(high) of each 16 values (its u - 32); the same of `low`.
  std::vector<int32_t> high_offsets, low_offsets;

  // Where row `row`'s bytes (low: `part` 1) from column `col` on (16 of them, 16 | col) are.
  int8_t* bytes_at(int64_t row, int64_t col, int part) {
    if (row >= tiled_rows) return (part ? low : high).data() + (row - tiled_rows) * cols + col;
    const int64_t parts = split ? 2 : 1, step = row / kTileRows * (cols / 64) + col / 64;
    return tiles.data() + ((step * parts + part) * kTileRows + row % kTileRows) * 64 + col % 64;
  }
};

// A super-block's exact integer sums for kBatch activation rows and 16 weight rows: the dots of q with the
// weights' integers scaled by their sub-block scales, 128 high + low (int32 each: the whole sum can pass
// 2^31), and of q with the sub-block mins (Q4_K, Q5_K).
template <int64_t kBatch>
struct SuperDots {
  Quads high[kBatch][kTileRegisters], low[kBatch][kTileRegisters], mins[kBatch][kTileRegisters];
};

// acc[b] += super-block s of tile t for activation rows [first, first + kBatch): d times the scaled dots
// minus dmin times the mins' dots, times the activations' scale. Both paths (VNNI and AMX) end here, with
// the same integers, so they give the same bits. NOTE: the row loops are unrolled from the start (GCC's own
// unrolling comes after its scalar replacement of arrays): at 16 rows a loop left whole keeps the caller's
// accumulators in memory, a load and a store around every multiply-add.
template <int64_t kType, int64_t kBatch>
__attribute__((always_inline)) inline void add_super_block(const uint8_t* t, int64_t s, const ByteActivations& a,
                                                           int64_t first, const SuperDots<kBatch>& dots,
                                                           Vec (&acc)[kBatch][kTileRegisters]) {
  constexpr TileFormat f = tile_format(kType);
  const int64_t supers = a.cols / kSuper;
  const float* scales = a.scales.data() + first * supers + s;
  for (int j = 0; j < kTileRegisters; ++j) {
    const Vec d = vec::load(reinterpret_cast<const c10::Half*>(t + f.d_at()) + j * vec::kLanes);
#pragma GCC unroll 16
    for (int64_t b = 0; b < kBatch; ++b)
      acc[b][j] = vec::fma(vec::exact_floats(dots.high[b][j], dots.low[b][j]), d * scales[b * supers], acc[b][j]);
    if constexpr (f.has_mins) {
      // NOTE: (-dmin) scale, not dmin (-scale): the same product, its negation on one vector instead of every row's.
      const Vec minus_dmin = -vec::load(reinterpret_cast<const c10::Half*>(t + f.d_at() + 32) + j * vec::kLanes);
#pragma GCC unroll 16
      for (int64_t b = 0; b < kBatch; ++b)
        acc[b][j] = vec::fma(vec::to_floats(dots.mins[b][j]), minus_dmin * scales[b * supers], acc[b][j]);
    }
  }
}

// ---- the AMX path (gguf_kquant_amx.cpp) ----

// The activation rows AMX takes out of `batch`: whole 16-row chunks from row 0, when the build has AMX-INT8,
// the process got the tile state, it is switched on (gguf_set_amx) and the batch is large enough; else 0.
int64_t amx_rows(int64_t batch);

// One thread's AMX tiles (configured while it holds rows to multiply) with its scratch: a super-block's
// weights unpacked for the tiles, and the float accumulators of a pass's AMX rows. NOTE: Vec-typed, for
// 64-byte alignment.
class AmxTiles {
 public:
  AmxTiles(int64_t type, int64_t cols, int64_t amx_rows);
  ~AmxTiles();
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
  // Groups [first_group, end_group)'s rows of y for activation rows [0, amx_rows).
  void multiply(const ByteActivations& a, const uint8_t* packed, int64_t rows, int64_t first_group,
                int64_t end_group, float* y);

 private:
  uint8_t* weights() { return reinterpret_cast<uint8_t*>(weights_.data()); }
  int64_t type_, cols_, amx_rows_;
#if defined(PAGEDSERVE_AMX)
  std::optional<amx::Tiles> tiles_;
#endif
  std::vector<Vec> weights_, acc_;
};

}  // namespace gguf::kquant
