// AMX-INT8 for the K-quant matmul's whole 16-row chunks of activation rows (gguf_kquant_matmul.cpp has the
// packed layout and takes the other rows, and every row where the build or the process has no AMX).
//
// One `tdpbssd` multiplies a tile of activation bytes (16 activation rows x 64 columns) by a tile of weight
// bytes (16 column quads x 16 weight rows x 4) into 16 x 16 int32 dots. The weights' sub-block scales are
// folded into their integers when a super-block is unpacked for the tiles (v = scale u, split into two bytes),
// so the tiles sum a whole super-block (256 columns, 4 steps) before anything leaves them, and one float
// epilogue per super-block (gguf_kquant.h: add_super_block, the VNNI path's own) scales the exact integers:
// both paths give the same bits. Before (a tile op per sub-block, each scaled in floats), the epilogue took
// most of the time; now 1.3-2.6x that at batch 64-256 (benchmarks/kquant_kernels.py --amx).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>

#include "amx.h"
#include "gguf_kquant.h"

#if defined(__AMX_INT8__) && defined(PAGEDSERVE_AMX)
#define PAGEDSERVE_KQUANT_AMX 1
#endif

namespace gguf::kquant {
namespace {

// Batches below this stay on the VNNI path. NOTE: 16, a whole chunk: at batch 16 AMX was already 1.0-1.7x as
// fast (by type and activation bits; benchmarks/kquant_kernels.py).
constexpr int64_t kMinAmxBatch = 16;

std::atomic<bool> amx_switched_on{true};  // gguf_set_amx: PAGEDSERVE_CPU_AMX, read in gguf_ops.py

#if defined(PAGEDSERVE_KQUANT_AMX)
static_assert(kTileRegisters == 1, "AMX builds have AVX-512: a tile row of 16 int32 dots is one Quads");

// The weights as AMX multiplies them, a super-block of a group at a time (unpacked once per pass over the
// activation rows, read by each of its chunks): per 64-column step, three tiles of 16 quads x 16 rows x 4
// bytes: the weight's
// integer times its sub-block scale, v = scale u (Q6_K: scale (u - 32), up to 2^12 in magnitude), split as
// 128 high + low (high signed, low in [0, 127]), then each column's sub-block min (Q4_K, Q5_K). The scales
// folded into the integers, a super-block's dots add up in the tiles: no float work per sub-block.
using amx::kTileBytes;
constexpr int64_t kSteps = kSuper / 64;
constexpr int64_t step_bytes(int64_t type) { return (tile_format(type).has_mins ? 3 : 2) * kTileBytes; }
// The activations' tiles of a 64-column step (ByteActivations::tiles): high, then low bytes.
constexpr int64_t activation_step_bytes(bool split) { return (split ? 2 : 1) * kTileBytes; }

// v = scale u is formed by `vpmaddubsw` per 16-bit lane, once with the scale on each lane's even byte and
// once on its odd byte (no widening or narrowing conversions: those are two-uop shuffles here), and the
// 16-bit products go back to byte order as low 7 bits and the rest.
template <int64_t kType>
void unpack_super_block(const uint8_t* t, uint8_t* out) {
  constexpr TileFormat f = tile_format(kType);
  constexpr int64_t kQuadsPerScale = f.columns_per_scale() / 4;
  const __m512i low7 = _mm512_set1_epi16(0x7F), low_byte = _mm512_set1_epi16(0xFF), pair = _mm512_set1_epi32(0x10001);
  for (int64_t sub = 0; sub < f.sub_blocks; ++sub) {
    const __m512i scale = _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + f.scales_at() + sub * kTileRows)));  // row r's, lane r
    const __m512i on_even = _mm512_mullo_epi32(_mm512_and_si512(scale, _mm512_set1_epi32(0xFF)), pair);
    const __m512i on_odd = _mm512_slli_epi32(on_even, 8);
    // Q6_K's u - 32: 32 scale off each product.
    const __m512i offset =
        _mm512_mullo_epi32(_mm512_and_si512(_mm512_slli_epi32(scale, 5), _mm512_set1_epi32(0xFFFF)), pair);
    __m512i mins{};
    if constexpr (f.has_mins)  // row r's min in each of its 4 bytes
      mins = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                                    reinterpret_cast<const __m128i*>(t + f.mins_at() + sub * kTileRows))),
                                _mm512_set1_epi32(0x01010101));
    for (int64_t c = sub * kQuadsPerScale; c < (sub + 1) * kQuadsPerScale; ++c) {
      __m512i u = _mm512_loadu_si512(t + kQuadBytes * (f.nibbles ? c / 2 : c));
      if constexpr (f.nibbles) u = _mm512_and_si512(c % 2 ? _mm512_srli_epi16(u, 4) : u, _mm512_set1_epi8(0x0F));
      __m512i even = _mm512_maddubs_epi16(u, on_even), odd = _mm512_maddubs_epi16(u, on_odd);
      if constexpr (!f.has_mins) even = _mm512_sub_epi16(even, offset), odd = _mm512_sub_epi16(odd, offset);
      const __m512i high = _mm512_or_si512(_mm512_and_si512(_mm512_srai_epi16(even, 7), low_byte),
                                           _mm512_slli_epi16(_mm512_srai_epi16(odd, 7), 8));
      const __m512i low =
          _mm512_or_si512(_mm512_and_si512(even, low7), _mm512_slli_epi16(_mm512_and_si512(odd, low7), 8));
      uint8_t* at = out + c / 16 * step_bytes(kType) + c % 16 * kQuadBytes;
      _mm512_storeu_si512(at, high);
      _mm512_storeu_si512(at + kTileBytes, low);
      if constexpr (f.has_mins) _mm512_storeu_si512(at + 2 * kTileBytes, mins);
    }
  }
}

// c += a b, signed bytes both.
template <int kC, int kA, int kB>
inline void dot_tiles() {
  asm volatile("tdpbssd %%tmm%c[b], %%tmm%c[a], %%tmm%c[c]" ::[c] "i"(kC), [a] "i"(kA), [b] "i"(kB));
}

using Dots = amx::Rows<Quads>;  // a dots tile: 16 activation rows of 16 weight rows' int32

// Super-block s's dots of 16 activation rows (their tiles from the super-block's first step on) and
// a group's unpacked weights: with activations a = 128 ah + al (8 bits: ah alone) and weights v = 128 vh + vl,
// tile 3 sums ah vh, 4 ah vl + al vh, 5 al vl, 6 ah min, 7 al min, so a v = 128 (128 [3] + [4]) + [5]
// (8 bits: 128 [3] + [4]) and a min = 128 [6] + [7] ([6]).
template <int64_t kType, bool kSplit>
__attribute__((always_inline)) inline void chunk_dots(const int8_t* tiles, const uint8_t* weights,
                                                      SuperDots<kTileRows>& out) {
  constexpr bool kMins = tile_format(kType).has_mins;
  amx::zero<3>(), amx::zero<4>(), amx::zero<5>();
  if constexpr (kMins) amx::zero<6>(), amx::zero<7>();
  for (int64_t step = 0; step < kSteps; ++step) {
    amx::load<0>(tiles, 64);
    if constexpr (kSplit) amx::load<1>(tiles + kTileBytes, 64);
    amx::load<2>(weights, kQuadBytes);  // vh
    dot_tiles<3, 0, 2>();
    if constexpr (kSplit) dot_tiles<4, 1, 2>();
    amx::load<2>(weights + kTileBytes, kQuadBytes);  // vl
    if constexpr (kSplit) dot_tiles<5, 1, 2>();  // NOTE: between the two sums into tile 4, which wait on each other
    dot_tiles<4, 0, 2>();
    if constexpr (kMins) {
      amx::load<2>(weights + 2 * kTileBytes, kQuadBytes);  // min
      dot_tiles<6, 0, 2>();
      if constexpr (kSplit) dot_tiles<7, 1, 2>();
    }
    weights += step_bytes(kType), tiles += activation_step_bytes(kSplit);
  }
  alignas(64) Dots hh, mixed, ll, min_high, min_low;
  amx::store<3>(hh), amx::store<4>(mixed);
  if constexpr (kSplit) amx::store<5>(ll);
  if constexpr (kMins) amx::store<6>(min_high);
  if constexpr (kMins && kSplit) amx::store<7>(min_low);
#pragma GCC unroll 16
  for (int64_t b = 0; b < kTileRows; ++b) {
    out.high[b][0] = kSplit ? (hh[b] << 7) + mixed[b] : hh[b];
    out.low[b][0] = kSplit ? ll[b] : mixed[b];
    if constexpr (kMins) out.mins[b][0] = kSplit ? (min_high[b] << 7) + min_low[b] : min_high[b];
  }
}

// Super-block s of a group for the activation rows of chunks [first, end): its unpacked weights stay in L1
// while every 16-row chunk takes them, and each chunk adds its dots to its accumulators (acc: 16 per chunk).
template <int64_t kType, bool kSplit>
void amx_super_block(const ByteActivations& a, int64_t first, int64_t end, int64_t cols, int64_t s,
                     const uint8_t* t, const uint8_t* weights, Vec* acc) {
  for (int64_t chunk = first; chunk < end; chunk += kTileRows) {
    alignas(64) SuperDots<kTileRows> dots;
    const int64_t at = (chunk / kTileRows * cols / 64 + s * kSteps) * activation_step_bytes(kSplit);
    chunk_dots<kType, kSplit>(a.tiles.data() + at, weights, dots);
    auto& chunk_acc = *reinterpret_cast<Vec(*)[kTileRows][1]>(acc + chunk - first);
    add_super_block<kType, kTileRows>(t, s, a, chunk, dots, chunk_acc);
  }
}

// Group g's rows of y for activation rows [first, end).
template <int64_t kType>
void amx_group(const ByteActivations& a, int64_t first, int64_t end, const uint8_t* packed, int64_t rows,
               int64_t cols, int64_t g, uint8_t* weights, Vec* acc, float* y) {
  constexpr TileFormat f = tile_format(kType);
  const int64_t supers = cols / kSuper;
  const uint8_t* t = packed + g * supers * f.bytes();
  std::fill(acc, acc + (end - first), Vec{});
  for (int64_t s = 0; s < supers; ++s, t += f.bytes()) {
    prefetch_tile(t, f.bytes());
    unpack_super_block<kType>(t, weights);
    // NOTE: load_tile tells the compiler it reads no memory: the unpacked stores must not wait past it.
    asm volatile("" ::: "memory");
    if (!a.split)
      amx_super_block<kType, false>(a, first, end, cols, s, t, weights, acc);
    else
      amx_super_block<kType, true>(a, first, end, cols, s, t, weights, acc);
  }
  for (int64_t chunk = first; chunk < end; chunk += kTileRows)
    store_group<kTileRows>(*reinterpret_cast<const Vec(*)[kTileRows][1]>(acc + chunk - first), chunk, rows, g, y);
}

// Activation rows per pass over a thread's groups: their tiles (1 MiB) stay in L2.
int64_t rows_per_pass(int64_t cols, bool split) {
  return amx::chunks_per_pass(cols * (split ? 2 : 1), int64_t{1} << 20) * kTileRows;
}
#endif

bool gguf_set_amx(bool enabled) {
  amx_switched_on = enabled;
  return amx::usable();
}

}  // namespace

int64_t amx_rows(int64_t batch) {
  return batch >= kMinAmxBatch && amx::usable() ? batch / kTileRows * kTileRows : 0;
}

#if defined(PAGEDSERVE_KQUANT_AMX)
AmxTiles::AmxTiles(int64_t type, int64_t cols, int64_t amx_rows) : type_(type), cols_(cols), amx_rows_(amx_rows) {
  if (amx_rows_ == 0) return;
  tiles_.emplace();
  weights_.resize(kSteps * step_bytes(type) / sizeof(Vec));
  acc_.resize(std::min(amx_rows, rows_per_pass(cols, false)));  // the longer pass
}

AmxTiles::~AmxTiles() = default;

void AmxTiles::multiply(const ByteActivations& a, const uint8_t* packed, int64_t rows, int64_t first_group,
                        int64_t end_group, float* y) {
  if (amx_rows_ == 0) return;
  const int64_t pass = rows_per_pass(cols_, a.split);
  for (int64_t first = 0; first < amx_rows_; first += pass)
    for (int64_t g = first_group; g < end_group; ++g) {
      const int64_t end = std::min(first + pass, amx_rows_);
      switch (type_) {
        case Q4_K: amx_group<Q4_K>(a, first, end, packed, rows, cols_, g, weights(), acc_.data(), y); break;
        case Q5_K: amx_group<Q5_K>(a, first, end, packed, rows, cols_, g, weights(), acc_.data(), y); break;
        default: amx_group<Q6_K>(a, first, end, packed, rows, cols_, g, weights(), acc_.data(), y);
      }
    }
}
#else
// amx_rows is 0 in this build: no tiles to configure, no rows to multiply.
AmxTiles::AmxTiles(int64_t type, int64_t cols, int64_t amx_rows) : type_(type), cols_(cols), amx_rows_(amx_rows) {}
AmxTiles::~AmxTiles() = default;
void AmxTiles::multiply(const ByteActivations&, const uint8_t*, int64_t, int64_t, int64_t, float*) {}
#endif

}  // namespace gguf::kquant

namespace amx {

#if defined(PAGEDSERVE_AMX)
bool usable() { return gguf::kquant::amx_switched_on && tile_state_granted(); }
#else
bool usable() { return false; }  // no AMX in this build
#endif

}  // namespace amx

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  // Whether the K-quant matmul takes whole 16-row chunks of activation rows on AMX (default on); returns
  // whether it now does: false when switched off, or the build or the process has no AMX.
  m.def("gguf_set_amx(bool enabled) -> bool", gguf::kquant::gguf_set_amx);
}
