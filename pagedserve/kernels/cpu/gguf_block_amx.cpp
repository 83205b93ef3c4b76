// AMX-BF16 for the packed Q4_0 / Q4_1 / Q8_0 matmul at batches of 16 rows and more (gguf_packed_matmul.cpp has
// the layout and the other paths), on either kind of activations:
//
// - Integer blocks (activation_bits 8 or 16; Q4_0 and Q4_1): the same bits as the VNNI kernel, so a row's
//   result does not depend on which path its batch took. Each block's integers q are split exactly into
//   two bfloat16, q = hi + lo with lo = q & 255 (8 significant bits each), the weights' integers are exact in
//   bfloat16, and every partial sum of a 32-column block is an integer under 2^24 (at most 32 * 32767 * 15),
//   exact in float32: the tile holds the block's integer dot as a float, which is what the VNNI kernel's
//   int32 -> float32 conversion gives; then the VNNI kernel's per-block scaling, in its order. NOTE: Q8_0's
//   sums pass 2^24; with hi in a tile of its own (the two met in one rounding) it ran at 0.75-1.0x the VNNI
//   kernel, so its integers stay there.
// - float32 (activation_bits 32, the exact setting): each value split exactly into three bfloat16 (x = hi +
//   mid + lo: 8 + 8 + 8 significand bits), exact products added in float32, then the block's fp16 scale (Q4_1:
//   plus its minimum times the block's sum of x): ATen's float32 GEMM on the dequantized weights up to the
//   order of the additions (AMX flushes subnormal inputs: values under 2^-126, none in activations).
//
// Every row of the batch takes the same arithmetic (the last 16-row chunk padded with zero rows). Two weight
// groups at a time (their sums alternate, so neither waits on its last tile op); the per-block scaling and
// the activations' tile loads bound it.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "amx.h"
#include "gguf_blocks.h"

#if defined(PAGEDSERVE_AMX) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define PAGEDSERVE_BLOCK_AMX 1
#endif

namespace gguf {

#if defined(PAGEDSERVE_BLOCK_AMX)
namespace {

using vec::Vec;

// c += a b, bfloat16 pairs into float32.
template <int kC, int kA, int kB>
inline void dot_tiles() {
  asm volatile("tdpbf16ps %%tmm%c[b], %%tmm%c[a], %%tmm%c[c]" ::[c] "i"(kC), [a] "i"(kA), [b] "i"(kB));
}

// The activation rows as tiles: per 16-row chunk (the last padded with zeros) and 32-column block, `parts`
// tiles of 16 rows x 32 bfloat16 (float x: hi, mid, lo; integers: hi, lo), with the per-block numbers the
// scaling reads, both [chunk * 16][block].
struct BlockTiles {
  int64_t parts;
  std::vector<uint16_t> tiles;  // [chunk][block][part][16][32]
  std::vector<float> scales;    // integers: the block's scale (float x: none)
  std::vector<float> sums;      // Q4_1: the block's sum as the dots see it, for its minimums' term
};

// 16 float32 lanes as bfloat16, rounded to nearest even, and back.
inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
inline __m512 from_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// One row's 32 values of a block as float x's three parts; returns the block's sum of x.
float split_floats(const __m512 (&v)[2], uint16_t* tile) {
  float sum = 0.f;
  for (int64_t half = 0; half < 2; ++half) {
    const __m256i hi = to_bf16(v[half]);
    const __m512 rest = _mm512_sub_ps(v[half], from_bf16(hi));
    const __m256i mid = to_bf16(rest);
    const __m256i lo = to_bf16(_mm512_sub_ps(rest, from_bf16(mid)));
    const __m256i part[3] = {hi, mid, lo};
    for (int64_t p = 0; p < 3; ++p)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + p * amx::kRows * kBlock + 16 * half), part[p]);
    sum += _mm512_reduce_add_ps(v[half]);
  }
  return sum;
}

// One row's 32 values of a block rounded as rounded_activations rounds them (gguf_blocks.h: the same
// operations on vector lanes, so the same integers and scale), as the parts hi and lo; sets the block's
// scale, returns its sum (the scale times the integers' sum).
float split_integers(const __m512 (&v)[2], float largest_integer, uint16_t* tile, float* scale) {
  const __m512 magnitude = _mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1]));
  const float largest = _mm512_reduce_max_ps(magnitude);
  // NOTE: x * 0 is 0 for finite x and NaN otherwise; as rounded_activations, a non-finite value makes the
  // scale NaN and the integers 0.
  const bool finite = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_mul_ps(v[0], _mm512_setzero_ps()),
                                                         _mm512_mul_ps(v[1], _mm512_setzero_ps()))) == 0.f;
  *scale = finite ? largest / largest_integer : std::numeric_limits<float>::quiet_NaN();
  const __m512 inverse = _mm512_set1_ps(finite && largest > 0.f ? largest_integer / largest : 0.f);
  __m512i total = _mm512_setzero_si512();
  for (int64_t half = 0; half < 2; ++half) {
    const __m512i q = finite ? _mm512_cvtps_epi32(_mm512_mul_ps(v[half], inverse)) : _mm512_setzero_si512();
    total = _mm512_add_epi32(total, q);
    const __m512i high = _mm512_andnot_si512(_mm512_set1_epi32(255), q);
    const __m256i part[2] = {to_bf16(_mm512_cvtepi32_ps(high)),
                             to_bf16(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(255))))};
    for (int64_t p = 0; p < 2; ++p)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + p * amx::kRows * kBlock + 16 * half), part[p]);
  }
  return *scale * static_cast<float>(_mm512_reduce_add_epi32(total));
}

BlockTiles split_activations(const float* x, int64_t batch, int64_t cols, int64_t type, int64_t bits) {
  const int64_t chunks = (batch + amx::kRows - 1) / amx::kRows, blocks = cols / kBlock, padded = chunks * amx::kRows;
  const bool integers = bits != 32, sums = type == Q4_1;
  BlockTiles out{integers ? 2 : 3, std::vector<uint16_t>(chunks * blocks * (integers ? 2 : 3) * amx::kRows * kBlock),
                 std::vector<float>(integers ? padded * blocks : 0), std::vector<float>(sums ? padded * blocks : 0)};
  const float largest_integer = bits == 8 ? 127.f : 32767.f;
  at::parallel_for(0, padded, 4, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      for (int64_t block = 0; block < blocks; ++block) {
        const int64_t at = (row / amx::kRows * blocks + block) * out.parts * amx::kRows + row % amx::kRows;
        uint16_t* tile = out.tiles.data() + at * kBlock;
        __m512 v[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        const float* values = x + row * cols + block * kBlock;
        if (row < batch)
          for (int64_t half = 0; half < 2; ++half) v[half] = _mm512_loadu_ps(values + 16 * half);
        const int64_t at_block = row * blocks + block;
        const float sum = integers ? split_integers(v, largest_integer, tile, &out.scales[at_block])
                                   : split_floats(v, tile);
        if (sums) out.sums[at_block] = sum;
      }
  });
  return out;
}

// bfloat16 of nibble - offset for every nibble, Q4_0's offset 8 (an exact table: small integers); Q8_0: none.
__m512i nibble_values(int64_t type) {
  alignas(64) uint16_t table[32];
  const int offset = type == Q4_0 ? 8 : 0;
  for (int i = 0; i < 32; ++i) table[i] = c10::BFloat16(static_cast<float>(i % 16 - offset)).x;
  return _mm512_load_si512(table);
}

// A 16-row tile of the packed layout (gguf_packed_matmul.cpp) as AMX's bfloat16 weight tile: row p holds
// columns 2p, 2p + 1 of the 16 weight rows (lanes). Q4: chunk L's low nibbles are columns 4L, 4L + 1 of each
// row, its high nibbles 4L + 2, 4L + 3 (pairs 2L, 2L + 1), as `values` gives them; Q8_0: chunk p is pair p.
void unpack_tile(const uint8_t* t, int64_t type, __m512i values, uint16_t* out) {
  if (type == Q8_0) {
    for (int64_t p = 0; p < 16; ++p)
      for (int64_t half = 0; half < 2; ++half) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 32 * p + 16 * half));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * p + 16 * half),
                            to_bf16(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes))));
      }
    return;
  }
  const __m512i low4 = _mm512_set1_epi16(0xF);
  for (int64_t chunk = 0; chunk < 8; ++chunk) {
    const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32 * chunk)));
    _mm512_storeu_si512(out + 64 * chunk, _mm512_permutexvar_epi16(_mm512_and_si512(bytes, low4), values));
    _mm512_storeu_si512(out + 64 * chunk + 32, _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), values));
  }
}

using Sums = amx::Rows<Vec>;

// acc[b] += the dots (in tile kC) of 16 activation rows with 16 weight rows of block i scaled as the VNNI
// kernel scales them: d (integers: times the row's block scale) times the dot, plus (Q4_1) m times the row's
// block sum.
template <int kC>
__attribute__((always_inline)) inline void scale_block(const BlockTiles& a, int64_t chunk, int64_t blocks,
                                                       int64_t i, const uint8_t* t, int64_t type, Vec* acc) {
  alignas(64) Sums dots;
  amx::store<kC>(dots);
  const int64_t scales_at = type == Q8_0 ? 512 : 256, at = chunk * amx::kRows * blocks + i;
  const Vec d = vec::load(reinterpret_cast<const c10::Half*>(t + scales_at));
  if (a.scales.empty()) {
#pragma GCC unroll 16
    for (int64_t b = 0; b < amx::kRows; ++b) acc[b] = vec::fma(dots[b], d, acc[b]);
  } else {
#pragma GCC unroll 16
    for (int64_t b = 0; b < amx::kRows; ++b) acc[b] = vec::fma(dots[b], d * a.scales[at + b * blocks], acc[b]);
  }
  if (type == Q4_1) {
    const Vec m = vec::load(reinterpret_cast<const c10::Half*>(t + scales_at + 32));
#pragma GCC unroll 16
    for (int64_t b = 0; b < amx::kRows; ++b) acc[b] = vec::fma(m, vec::splat(a.sums[at + b * blocks]), acc[b]);
  }
}

// Block i of one or two groups (weights in tiles 6 and 7, tiles t and t2) for the 16 rows of `chunk`: the
// parts' dots summed in tile kAcc (and kAcc + 2), lo first (float x: lo, mid, hi in tiles 4, 5, 1; integers:
// lo, hi in 4, 5). The two groups' sums alternate, so neither waits on its previous tile op; on integers,
// chunks alternate between accumulators 0, 2 and 1, 3, so one chunk's tile ops can run during the scaling of
// the one before.
template <int64_t kParts, int kAcc, bool kPair>
void add_block(const BlockTiles& a, int64_t chunk, int64_t blocks, int64_t i, const uint8_t* t, const uint8_t* t2,
               int64_t type, Vec* acc, Vec* acc2) {
  static_assert(kParts == 2 || kAcc == 0, "float x's third part takes tile 1");
  constexpr int64_t kPart = amx::kRows * kBlock;
  const uint16_t* parts = a.tiles.data() + (chunk * blocks + i) * kParts * kPart;
  amx::zero<kAcc>();
  if constexpr (kPair) amx::zero<kAcc + 2>();
  amx::load<4>(parts + (kParts - 1) * kPart, amx::kRowBytes);
  amx::load<5>(parts + (kParts - 2) * kPart, amx::kRowBytes);
  if constexpr (kParts == 3) amx::load<1>(parts, amx::kRowBytes);
  dot_tiles<kAcc, 4, 6>();
  if constexpr (kPair) dot_tiles<kAcc + 2, 4, 7>();
  dot_tiles<kAcc, 5, 6>();
  if constexpr (kPair) dot_tiles<kAcc + 2, 5, 7>();
  if constexpr (kParts == 3) {
    dot_tiles<0, 1, 6>();
    if constexpr (kPair) dot_tiles<2, 1, 7>();
  }
  scale_block<kAcc>(a, chunk, blocks, i, t, type, acc);
  if constexpr (kPair) scale_block<kAcc + 2>(a, chunk, blocks, i, t2, type, acc2);
}

// Groups [g, g + count) (count 1 or 2) for the chunks [first, last) of activation rows.
template <int64_t kParts>
void add_groups(const BlockTiles& a, int64_t first, int64_t last, const uint8_t* packed, int64_t type,
                int64_t blocks, int64_t g, int64_t count, uint16_t* weights, Vec* acc) {
  const int64_t tile = kTileRows * block_format(type).bytes, rows = (last - first) * amx::kRows;
  const uint8_t* t = packed + g * blocks * tile;
  const __m512i values = nibble_values(type);  // NOTE: once, not per block (32 conversions, an unpack's cost)
  for (int64_t i = 0; i < blocks; ++i, t += tile) {
    const uint8_t* t2 = t + blocks * tile;  // the next group's block i
    for (int64_t k = 0; k < count; ++k) {
      if (first == 0) prefetch_tile(t + k * blocks * tile, tile);
      unpack_tile(t + k * blocks * tile, type, values, weights + k * amx::kRows * kBlock);
    }
    asm volatile("" ::: "memory");  // the unpacked stores before the tile loads (amx.h)
    amx::load<6>(weights, amx::kRowBytes);
    if (count == 2) amx::load<7>(weights + amx::kRows * kBlock, amx::kRowBytes);
    for (int64_t chunk = first; chunk < last; ++chunk) {
      Vec* at = acc + (chunk - first) * amx::kRows;
      constexpr int kOdd = kParts == 2 ? 1 : 0;
      if (count == 2 && chunk % 2)
        add_block<kParts, kOdd, true>(a, chunk, blocks, i, t, t2, type, at, at + rows);
      else if (count == 2)
        add_block<kParts, 0, true>(a, chunk, blocks, i, t, t2, type, at, at + rows);
      else if (chunk % 2)
        add_block<kParts, kOdd, false>(a, chunk, blocks, i, t, t2, type, at, nullptr);
      else
        add_block<kParts, 0, false>(a, chunk, blocks, i, t, t2, type, at, nullptr);
    }
  }
}

template <int64_t kParts>
void block_amx(const BlockTiles& a, int64_t batch, const uint8_t* packed, int64_t type, int64_t rows, int64_t cols,
               float* y) {
  const int64_t blocks = cols / kBlock;
  const int64_t chunks = (batch + amx::kRows - 1) / amx::kRows, groups = (rows + kTileRows - 1) / kTileRows;
  // Chunks per pass over a thread's groups: their tiles (1.5 MiB) stay in L2, and each block's weights are
  // unpacked once per pass.
  const int64_t pass = amx::chunks_per_pass(cols * kParts * 2, int64_t{3} << 19);
  // NOTE: by pairs of groups, as add_block takes them.
  at::parallel_for(0, (groups + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    const amx::Tiles tiles;
    const int64_t pass_rows = std::min(pass, chunks) * amx::kRows;
    std::vector<Vec> acc(2 * pass_rows);
    alignas(64) uint16_t weights[2 * amx::kRows * kBlock];
    for (int64_t first = 0; first < chunks; first += pass) {
      const int64_t last = std::min(first + pass, chunks), rows_here = (last - first) * amx::kRows;
      for (int64_t g = 2 * begin; g < std::min(2 * end, groups); g += 2) {
        const int64_t count = std::min<int64_t>(2, groups - g);
        std::fill(acc.begin(), acc.end(), Vec{});
        add_groups<kParts>(a, first, last, packed, type, blocks, g, count, weights, acc.data());
        // The rows of the batch (not the last chunk's padding), a row at a time.
        for (int64_t k = 0; k < count; ++k)
          for (int64_t row = first * amx::kRows; row < std::min(last * amx::kRows, batch); ++row) {
            const Vec* sums = acc.data() + k * rows_here + row - first * amx::kRows;
            store_group<1>(*reinterpret_cast<const Vec(*)[1][1]>(sums), row, rows, g + k, y);
          }
      }
    }
  });
}

}  // namespace

bool block_amx_usable(int64_t type, int64_t batch, int64_t activation_bits) {
  const bool takes = type == Q4_0 || type == Q4_1 || (type == Q8_0 && activation_bits == 32);
  return batch >= amx::kRows && takes && amx::usable();
}

void block_amx_matmul(const float* x, int64_t batch, const uint8_t* packed, int64_t type, int64_t rows,
                      int64_t cols, int64_t activation_bits, float* y) {
  const BlockTiles a = split_activations(x, batch, cols, type, activation_bits);
  if (a.parts == 3) return block_amx<3>(a, batch, packed, type, rows, cols, y);
  block_amx<2>(a, batch, packed, type, rows, cols, y);
}
#else
bool block_amx_usable(int64_t, int64_t, int64_t) { return false; }  // no AMX-BF16 in this build
void block_amx_matmul(const float*, int64_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t, float*) {}
#endif

}  // namespace gguf
