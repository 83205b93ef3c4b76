// AMX-BF16 for prefill-sized batches of the packed Q4_0 / Q4_1 / Q8_0 matmul on float32 activations
// (gguf_packed_matmul.cpp has the layout and the other paths).
//
// Exact as the float path is: each float32 activation is split into three bfloat16 (x = hi + mid + lo,
// exactly: 8 + 8 + 8 significand bits), the weights' integers (q - 8, q) are exact in bfloat16, and
// `tdpbf16ps` multiplies exactly and adds in float32, so a 32-column block's dot is a float32 sum of exact
// products, which the block's fp16 scale then multiplies (Q4_1: plus its minimum times the block's sum of x),
// as ATen's float32 GEMM on the dequantized weights computes it up to the order of the additions (and AMX
// flushes subnormal inputs: values under 2^-126, none in activations). Every row of the batch takes the same
// arithmetic (the last chunk padded with zero rows), so a row's result does not depend on what shares it.
// Three tile ops per 16 x 16 x 32 block and two weight groups at a time (their sums alternate, so neither waits
// on its last tile op); the per-block scaling and the activations' tile loads bound it: 1.0-1.8x ATen's
// float32 GEMM on the same tiles (2 threads, batch 256-1024, a 1B-class Llama's shapes).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "amx.h"
#include "gguf_blocks.h"

#if defined(PAGEDSERVE_AMX) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define PAGEDSERVE_FLOAT_AMX 1
#endif

namespace gguf {

#if defined(PAGEDSERVE_FLOAT_AMX)
namespace {

using vec::Vec;
constexpr int64_t kParts = 3;  // hi, mid, lo

// c += a b, bfloat16 pairs into float32.
template <int kC, int kA, int kB>
inline void dot_tiles() {
  asm volatile("tdpbf16ps %%tmm%c[b], %%tmm%c[a], %%tmm%c[c]" ::[c] "i"(kC), [a] "i"(kA), [b] "i"(kB));
}

// x's rows as tiles: per 16-row chunk (the last padded with zeros) and 32-column block, the three parts'
// tiles of 16 rows x 32 bfloat16; and, for Q4_1, each row's sum over each block.
struct FloatTiles {
  std::vector<uint16_t> parts;  // [chunk][block][part][16][32]
  std::vector<float> sums;      // [chunk * 16][block]
};

// 16 float32 lanes as bfloat16, rounded to nearest even, and back.
inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
inline __m512 from_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

FloatTiles split_activations(const float* x, int64_t batch, int64_t cols, bool sums) {
  const int64_t chunks = (batch + amx::kRows - 1) / amx::kRows, blocks = cols / kBlock;
  FloatTiles out{std::vector<uint16_t>(chunks * blocks * kParts * amx::kRows * kBlock),
                 std::vector<float>(sums ? chunks * amx::kRows * blocks : 0)};
  at::parallel_for(0, chunks * amx::kRows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      for (int64_t block = 0; block < blocks; ++block) {
        const int64_t at = (row / amx::kRows * blocks + block) * kParts * amx::kRows + row % amx::kRows;
        uint16_t* tile = out.parts.data() + at * kBlock;
        float sum = 0.f;
        for (int64_t half = 0; half < kBlock; half += 16) {
          const __m512 v = row < batch ? _mm512_loadu_ps(x + row * cols + block * kBlock + half) : _mm512_setzero_ps();
          const __m256i hi = to_bf16(v);
          const __m512 rest = _mm512_sub_ps(v, from_bf16(hi));
          const __m256i mid = to_bf16(rest);
          const __m256i lo = to_bf16(_mm512_sub_ps(rest, from_bf16(mid)));
          const __m256i part[kParts] = {hi, mid, lo};
          for (int64_t p = 0; p < kParts; ++p)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + p * amx::kRows * kBlock + half), part[p]);
          if (sums) sum += _mm512_reduce_add_ps(v);
        }
        if (sums) out.sums[row * blocks + block] = sum;
      }
  });
  return out;
}

// A 16-row tile of the packed layout (gguf_packed_matmul.cpp) as AMX's bfloat16 weight tile: row p holds
// columns 2p, 2p + 1 of the 16 weight rows (lanes). Q4: chunk L's low nibbles are columns 4L, 4L + 1 of each
// row, its high nibbles 4L + 2, 4L + 3 (pairs 2L, 2L + 1); Q8_0: chunk p is pair p.
void unpack_tile(const uint8_t* t, int64_t type, uint16_t* out) {
  if (type == Q8_0) {
    for (int64_t p = 0; p < 16; ++p)
      for (int64_t half = 0; half < 2; ++half) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 32 * p + 16 * half));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * p + 16 * half),
                            to_bf16(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes))));
      }
    return;
  }
  // bfloat16 of nibble - offset for every nibble (an exact table: small integers).
  alignas(64) uint16_t table[32];
  const int offset = type == Q4_0 ? 8 : 0;
  for (int i = 0; i < 32; ++i) table[i] = c10::BFloat16(static_cast<float>(i % 16 - offset)).x;
  const __m512i values = _mm512_load_si512(table), low4 = _mm512_set1_epi16(0xF);
  for (int64_t chunk = 0; chunk < 8; ++chunk) {
    const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32 * chunk)));
    _mm512_storeu_si512(out + 64 * chunk, _mm512_permutexvar_epi16(_mm512_and_si512(bytes, low4), values));
    _mm512_storeu_si512(out + 64 * chunk + 32, _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), values));
  }
}

using Sums = amx::Rows<Vec>;

// acc[b] += the dots (in tile kC) of 16 activation rows with 16 weight rows of block i (tile t) times their
// scales d, plus (Q4_1) their minimums times the rows' block sums.
template <int kC>
__attribute__((always_inline)) inline void scale_block(const FloatTiles& a, int64_t chunk, int64_t blocks, int64_t i,
                                                       const uint8_t* t, int64_t type, Vec* acc) {
  alignas(64) Sums dots;
  amx::store<kC>(dots);
  const int64_t scales_at = type == Q8_0 ? 512 : 256;
  const Vec d = vec::load(reinterpret_cast<const c10::Half*>(t + scales_at));
#pragma GCC unroll 16
  for (int64_t b = 0; b < amx::kRows; ++b) acc[b] = vec::fma(dots[b], d, acc[b]);
  if (type == Q4_1) {
    const Vec m = vec::load(reinterpret_cast<const c10::Half*>(t + scales_at + 32));
    const float* sums = a.sums.data() + chunk * amx::kRows * blocks + i;
#pragma GCC unroll 16
    for (int64_t b = 0; b < amx::kRows; ++b) acc[b] = vec::fma(m, vec::splat(sums[b * blocks]), acc[b]);
  }
}

// Block i of one or two groups (weights in tiles 3 and 5, tiles t and t2) for the 16 rows of `chunk`: the
// three parts' dots summed in tile 4 (and 6), lo first; the two groups' sums alternate, so neither waits on
// its previous tile op.
template <bool kPair>
void add_block(const FloatTiles& a, int64_t chunk, int64_t blocks, int64_t i, const uint8_t* t, const uint8_t* t2,
               int64_t type, Vec* acc, Vec* acc2) {
  const uint16_t* parts = a.parts.data() + (chunk * blocks + i) * kParts * amx::kRows * kBlock;
  amx::zero<4>();
  if constexpr (kPair) amx::zero<6>();
  amx::load<0>(parts, amx::kRowBytes);
  amx::load<1>(parts + amx::kRows * kBlock, amx::kRowBytes);
  amx::load<2>(parts + 2 * amx::kRows * kBlock, amx::kRowBytes);
  dot_tiles<4, 2, 3>();
  if constexpr (kPair) dot_tiles<6, 2, 5>();
  dot_tiles<4, 1, 3>();
  if constexpr (kPair) dot_tiles<6, 1, 5>();
  dot_tiles<4, 0, 3>();
  if constexpr (kPair) dot_tiles<6, 0, 5>();
  scale_block<4>(a, chunk, blocks, i, t, type, acc);
  if constexpr (kPair) scale_block<6>(a, chunk, blocks, i, t2, type, acc2);
}

// Groups [g, g + count) (count 1 or 2) for the chunks [first, last) of activation rows.
void add_groups(const FloatTiles& a, int64_t first, int64_t last, const uint8_t* packed, int64_t type,
                int64_t blocks, int64_t g, int64_t count, uint16_t* weights, Vec* acc) {
  const int64_t tile = kTileRows * block_format(type).bytes, rows = (last - first) * amx::kRows;
  const uint8_t* t = packed + g * blocks * tile;
  for (int64_t i = 0; i < blocks; ++i, t += tile) {
    const uint8_t* t2 = t + blocks * tile;  // the next group's block i
    for (int64_t k = 0; k < count; ++k) {
      if (first == 0) prefetch_tile(t + k * blocks * tile, tile);
      unpack_tile(t + k * blocks * tile, type, weights + k * amx::kRows * kBlock);
    }
    asm volatile("" ::: "memory");  // the unpacked stores before the tile loads (amx.h)
    amx::load<3>(weights, amx::kRowBytes);
    if (count == 2) amx::load<5>(weights + amx::kRows * kBlock, amx::kRowBytes);
    for (int64_t chunk = first; chunk < last; ++chunk) {
      Vec* at = acc + (chunk - first) * amx::kRows;
      if (count == 2)
        add_block<true>(a, chunk, blocks, i, t, t2, type, at, at + rows);
      else
        add_block<false>(a, chunk, blocks, i, t, t2, type, at, nullptr);
    }
  }
}

}  // namespace

bool float_amx_usable(int64_t type, int64_t batch) {
  return batch >= amx::kRows && (type == Q4_0 || type == Q4_1 || type == Q8_0) && amx::usable();
}

void float_amx_matmul(const float* x, int64_t batch, const uint8_t* packed, int64_t type, int64_t rows,
                      int64_t cols, float* y) {
  const int64_t blocks = cols / kBlock;
  const int64_t chunks = (batch + amx::kRows - 1) / amx::kRows, groups = (rows + kTileRows - 1) / kTileRows;
  // Chunks per pass over a thread's groups: their tiles (about 1.5 MiB) stay in L2 while every group takes
  // them, and each block's weights are unpacked once per pass.
  const int64_t pass = std::max<int64_t>(1, (int64_t{3} << 19) / (cols * kParts * 2 * amx::kRows));
  const FloatTiles a = split_activations(x, batch, cols, type == Q4_1);
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
        add_groups(a, first, last, packed, type, blocks, g, count, weights, acc.data());
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
#else
bool float_amx_usable(int64_t, int64_t) { return false; }  // no AMX-BF16 in this build
void float_amx_matmul(const float*, int64_t, const uint8_t*, int64_t, int64_t, int64_t, float*) {}
#endif

}  // namespace gguf
