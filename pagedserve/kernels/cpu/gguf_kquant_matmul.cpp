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
// planes: 1.45x and 1.22x their bytes, for one load per quad). The values are AMX's weight tile layout too:
// where the CPU has AMX-INT8, whole 16-row chunks of activation rows take tile dot products instead
// (gguf_kquant_amx.cpp), with the same results to the bit.
#include <ATen/Parallel.h>
#include <torch/extension.h>

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

// Rows [first, first + rows) of `a` from their rounded blocks.
template <typename Int>
void split_rows(const ActivationBlocks<Int>& blocks, int64_t first, int64_t rows, int64_t cols, ByteActivations& a) {
  const int64_t row_blocks = cols / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = first + r;
    for (int64_t half = 0; half < cols / 16; ++half) {
      int32_t sum = 0;
      for (int64_t k = 16 * half; k < 16 * half + 16; ++k) {
        const int32_t q = blocks.rounded[r * cols + k];
        a.high[row * cols + k] = static_cast<int8_t>(sizeof(Int) == 2 ? q >> 7 : q);  // arithmetic: floor(q / 128)
        if constexpr (sizeof(Int) == 2) a.low[row * cols + k] = static_cast<int8_t>(q & 127);
        sum += q;
      }
      a.offsets[half * a.batch + row] = 32 * sum;
    }
    for (int64_t block = 0; block < row_blocks; ++block) {
      a.scales[block * a.batch + row] = blocks.scales[r * row_blocks + block];
      a.sums[block * a.batch + row] = blocks.sums[r * row_blocks + block];
    }
  }
}

// NOTE: rounded in parallel, by rows: on one thread it took 10-15% of a prefill-sized matmul's time.
ByteActivations round_activations(const float* x, int64_t batch, int64_t cols, int64_t bits) {
  const int64_t values = batch * cols;
  ByteActivations a{batch, std::vector<int8_t>(values), std::vector<int8_t>(bits == 8 ? 0 : values),
                    std::vector<float>(values / kBlock), std::vector<float>(values / kBlock),
                    std::vector<int32_t>(values / 16)};
  constexpr int64_t kRowsPerTask = 4;
  at::parallel_for(0, batch, kRowsPerTask, [&](int64_t begin, int64_t end) {
    const float* rows = x + begin * cols;
    if (bits == 8) return split_rows(rounded_activations<int8_t>(rows, end - begin, cols), begin, end - begin, cols, a);
    split_rows(rounded_activations<int16_t>(rows, end - begin, cols, 16383.f), begin, end - begin, cols, a);
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
  constexpr int64_t kPerScale = f.columns_per_scale();
  const int64_t supers = cols / kSuper;
  const uint8_t* t = packed + g * supers * f.bytes();
  Vec acc[kBatch][kTileRegisters];
  for (auto& per_row : acc) std::fill(per_row, per_row + kTileRegisters, Vec{});
  for (int64_t s = 0; s < supers; ++s, t += f.bytes()) {
    prefetch_tile(t, f.bytes());
    const SuperScales scales = super_scales<kType>(t);
    int64_t at[kBatch];
    for (int64_t b = 0; b < kBatch; ++b) at[b] = (first + b) * cols + s * kSuper;
    for (int64_t sub = 0; sub < f.sub_blocks; ++sub) {
      Quads dots[kBatch][kTileRegisters] = {};
      sub_block_dots<kType, kBatch, kSplit>(t, sub * kPerScale / 4, kPerScale / 4, a, at, dots);
      add_sub_block<kType, kBatch>(t, scales, sub, s * kSuper + sub * kPerScale, a, first, dots, acc);
    }
  }
  store_group<kBatch>(acc, first, rows, g, y);
}

// Each thread takes whole groups and runs every chunk of activation rows through a group before the next,
// so the group's tiles come from memory once and from cache for the later chunks (the cache blocking of a
// prefill GEMM: a group of a 2048-column Q4_K matrix is 18 KiB). AMX, where it runs, takes the whole 16-row
// chunks first (gguf_kquant_amx.cpp), these dots the rows left.
template <int64_t kType, bool kSplit>
void kquant_matmul(const ByteActivations& a, int64_t batch, const uint8_t* packed, int64_t rows, int64_t cols,
                   float* y) {
  // NOTE: split, twice the dot accumulators: 6 rows a pass on AVX-512 (4: 15% slower at batch 64; 8 spilled on
  // Q6_K), 3 on AVX2.
  constexpr int64_t kChunk = kSplit ? kBatchChunk * 3 / 4 : kBatchChunk;
  const int64_t groups = (rows + kTileRows - 1) / kTileRows, on_amx = amx_rows(batch);
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    AmxTiles amx(kType, cols, on_amx);
    for (int64_t g = begin; g < end; ++g) {
      amx.multiply(a, packed, rows, g, y);
      for (int64_t first = on_amx; first < batch; first += kChunk)
        with_batch<kChunk>(std::min(kChunk, batch - first), [&](auto count) {
          kquant_group<kType, decltype(count)::value, kSplit>(a, first, packed, rows, cols, g, y);
        });
    }
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
