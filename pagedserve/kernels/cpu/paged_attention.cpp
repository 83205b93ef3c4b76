// Paged attention on CPU for every query token of a step (decodes, speculative verifications and prefill
// chunks alike): K/V read in place through the block tables (no gather into a padded copy), float32
// softmax and accumulation for every storage dtype. An fp8 cache (uint8 bits, --kv-cache-dtype fp8*) is
// widened a block at a time (vec.h's fp8 codec) and times the layer's K or V scale.
//
// Batch invariance: a query token's output is the same bits however the step was cut and whatever shares
// it. Its arithmetic is fixed by its own position (the tokens it attends to), the layer and the block size:
// - Work item = (request, tile of up to kMaxTile consecutive query tokens of it, kv head). The tile shares
//   each K/V block's loads (and widening) among its queries, but each query's scores, softmax and sums are
//   made by the same calls over the same row ranges that the query alone in the call makes.
// - An item is wholly one thread's: a query's keys are never split across threads (no split-K), so neither
//   the thread count nor the scheduling moves a bit.
// - Every multiply-add is an explicit fma and every sum has a fixed tree: what the compiler decides
//   (contracting a * b + c or not, vectorizing a loop, peeling it for alignment) cannot change a result.
//
// Within an item the G = num_heads / num_kv_heads query heads of the kv head are attended together, so each
// K/V row is read from memory once per tile and used G times per query. Two passes, block by block with the
// blocks ahead prefetched: scores q.k for every token (kept in a per-thread scratch buffer), the
// max-subtracted softmax, then sum_t p_t * v_t. Scores are made four rows at a time with one shared lane
// reduction, and each V row tile is loaded once for up to four query heads: together 1.2-1.5x faster than
// a reduction per score and a V pass per head (batch 32, 128-1024 tokens, AVX-512; min of 300 calls, old
// and new kernels alternated on the same machine). Items are spread over OpenMP threads with dynamic
// scheduling because their costs follow the (uneven) sequence lengths.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
// NOTE: torch's pybind11 type casters (at::Tensor arguments) without torch/extension.h, which adds the whole
// C++ frontend: ~15 s less per compile.
#include <torch/csrc/utils/pybind.h>

#include "decode_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "vec_fp8.h"

namespace {

using vec::Vec;
// NOTE: AVX-512's 16 lanes measured 1.3-1.5x faster than 8 on a decode batch of 32
// (benchmarks/cpu_attention.py).
constexpr int64_t kLanes = vec::kLanes;
constexpr int64_t kTile = 64;  // head_dim columns whose accumulators stay in registers (4 or 8 vectors)

struct Geometry {
  int64_t num_kv_heads;
  int64_t group;  // query heads per kv head
  int64_t head_dim;
  int64_t block_size;
  int64_t max_blocks;  // columns of block_tables
};

// How scores are made: q.k * scale, then (soft_cap > 0) soft_cap * tanh(s / soft_cap); with a sliding
// window (window > 0) a request of seq_len tokens attends only to its last `window` tokens. `sinks` (or
// null): one learned logit per query head that joins the softmax's denominator only (gpt-oss). `ends` (or
// null): per query row, the end of the positions it attends to when past its own (the last token of its
// image, whose tokens attend each other both ways: Gemma 3), else 0.
struct Scoring {
  float scale;
  float soft_cap;
  int64_t window;
  const float* sinks;
  const int64_t* ends;
};

inline float dot(const float* a, const float* b, int64_t n) {
  Vec acc0 = {}, acc1 = {};  // two accumulators: consecutive FMAs do not wait on each other
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    acc0 = vec::fma(vec::load(a + i), vec::load(b + i), acc0);
    acc1 = vec::fma(vec::load(a + i + kLanes), vec::load(b + i + kLanes), acc1);
  }
  for (; i + kLanes <= n; i += kLanes) acc0 = vec::fma(vec::load(a + i), vec::load(b + i), acc0);
  float sum = vec::sum(acc0 + acc1);
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

// e^x for softmax numerators (x <= 0) without a libm call, so the loop over it vectorizes: Cephes' expf,
// 2^n * (1 + r + r^2 P(r)) with x = n ln2 + r, |r| <= ln2 / 2; within 2 ulp of expf. x below -87 (where
// e^x is below float's normal range) gives e^-87, as good as 0 next to the max term's 1. Every step is one
// rounding (explicit fma), so a vectorized and a scalar evaluation give the same bits.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.f);
  const float n = std::floor(std::fma(x, 1.44269504f, 0.5f));  // in [-126, 0]
  const float r = std::fma(n, 2.12194440e-4f, std::fma(-n, 0.693359375f, x));  // ln2 in two parts
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const int32_t two_to_n_bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_to_n;
  std::memcpy(&two_to_n, &two_to_n_bits, sizeof two_to_n);  // a bit_cast that C++17 builds (older torch) take
  return (std::fma(p * r, r, r) + 1.f) * two_to_n;
}

// p[0, n) = e^(p - max) in place; returns their sum, added lane by lane, then the lanes' tree, then the
// tail: one order for a given n, however the compiler vectorizes the exponentials.
inline float exponentiate(float* p, int64_t n, float max) {
#pragma omp simd  // lane by lane: the same bits as one at a time
  for (int64_t t = 0; t < n; ++t) p[t] = exp_nonpositive(p[t] - max);
  Vec acc = {};
  int64_t t = 0;
  for (; t + kLanes <= n; t += kLanes) acc += vec::load(p + t);
  float sum = vec::sum(acc);
  for (; t < n; ++t) sum += p[t];
  return sum;
}

// The rows of one kv head in one block: n tokens, `stride` elements apart, head_dim elements each.
template <typename T>
struct Rows {
  const T* data;
  int64_t n;
  int64_t stride;
};

// The rows as float32: float32 rows are read in place, others are widened into `buffer` (n * D floats), fp8
// values times `fp8_scale` (a row holding a NaN pattern value by value: the vector widening misreads them).
template <typename C>
inline Rows<float> widen(Rows<C> rows, int64_t D, float* buffer, float fp8_scale) {
  if constexpr (std::is_same_v<C, float>) {
    return rows;
  } else {
    for (int64_t t = 0; t < rows.n; ++t) {
      const C* row = rows.data + t * rows.stride;
      float* out = buffer + t * D;
      int64_t d = 0;
      if constexpr (vec::kIsFp8<C>) {
        // value / kWidenScale * (scale * kWidenScale): the value times the scale, rounded once
        const Vec scale = vec::splat(fp8_scale * C::kWidenScale);
        const bool vectors = !vec::has_nan(row, D);
        for (; vectors && d + kLanes <= D; d += kLanes) vec::store(out + d, vec::widen(row + d) * scale);
        for (; d < D; ++d) out[d] = vec::decode(row[d]) * fp8_scale;
      } else {
        for (; d + kLanes <= D; d += kLanes) vec::store(out + d, vec::load(row + d));
        for (; d < D; ++d) out[d] = static_cast<float>(row[d]);
      }
    }
    return {buffer, rows.n, D};
  }
}

// Query heads whose accumulators share one pass over a block's V rows (each row tile loaded once for all
// of them): 4 x 4 tiles of 16 lanes stay in AVX-512's 32 registers; AVX2's 16 registers hold one head's.
constexpr int64_t kHeadsPerPass = kLanes == 16 ? 4 : 1;

// acc[h][0:D] += sum_t p[h][t] * v[t] for the H heads h (p[h]: `p_stride` apart, acc[h]: D apart). Column
// tiles outermost, so a tile's accumulators stay in registers over all of the block's rows (which stay in
// L1) instead of being loaded and stored once per row.
template <int64_t H>
inline void accumulate(const float* p, int64_t p_stride, Rows<float> v, float* acc, int64_t D) {
  int64_t c = 0;
  for (; c + kTile <= D; c += kTile) {
    constexpr int64_t J = kTile / kLanes;
    Vec a[H][J];
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < J; ++j) a[h][j] = vec::load(acc + h * D + c + j * kLanes);
    for (int64_t t = 0; t < v.n; ++t) {
      const float* row = v.data + t * v.stride + c;
      Vec r[J];
      for (int64_t j = 0; j < J; ++j) r[j] = vec::load(row + j * kLanes);
      for (int64_t h = 0; h < H; ++h) {
        const Vec weight = vec::splat(p[h * p_stride + t]);
        for (int64_t j = 0; j < J; ++j) a[h][j] = vec::fma(weight, r[j], a[h][j]);
      }
    }
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < J; ++j) vec::store(acc + h * D + c + j * kLanes, a[h][j]);
  }
  for (int64_t h = 0; h < H; ++h) {
    const float* ph = p + h * p_stride;
    float* acc_h = acc + h * D;
    int64_t col = c;
    for (; col + kLanes <= D; col += kLanes) {
      Vec a = vec::load(acc_h + col);
      for (int64_t t = 0; t < v.n; ++t) {
        a = vec::fma(vec::splat(ph[t]), vec::load(v.data + t * v.stride + col), a);
      }
      vec::store(acc_h + col, a);
    }
    for (; col < D; ++col) {
      for (int64_t t = 0; t < v.n; ++t) acc_h[col] = std::fma(ph[t], v.data[t * v.stride + col], acc_h[col]);
    }
  }
}

// accumulate() for G heads, kHeadsPerPass at a time, then the rest in one pass.
inline void accumulate_heads(const float* p, int64_t p_stride, Rows<float> v, float* acc, int64_t G,
                             int64_t D) {
  int64_t h = 0;
  for (; h + kHeadsPerPass <= G; h += kHeadsPerPass)
    accumulate<kHeadsPerPass>(p + h * p_stride, p_stride, v, acc + h * D, D);
  p += h * p_stride, acc += h * D;
  switch (G - h) {  // < kHeadsPerPass
    case 3: accumulate<3>(p, p_stride, v, acc, D); break;
    case 2: accumulate<2>(p, p_stride, v, acc, D); break;
    case 1: accumulate<1>(p, p_stride, v, acc, D); break;
    default: break;
  }
}

// scores[t] = q . k[t] for a block's rows, four rows at a time (four independent FMA chains and one
// shared reduction) when D is a whole number of vectors.
inline void score_rows(const float* q, Rows<float> k, int64_t D, float* scores) {
  int64_t t = 0;
  if (D % kLanes == 0) {
    for (; t + 4 <= k.n; t += 4) {
      const float* r = k.data + t * k.stride;
      Vec a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int64_t c = 0; c < D; c += kLanes) {
        const Vec qv = vec::load(q + c);
        a0 = vec::fma(qv, vec::load(r + c), a0);
        a1 = vec::fma(qv, vec::load(r + k.stride + c), a1);
        a2 = vec::fma(qv, vec::load(r + 2 * k.stride + c), a2);
        a3 = vec::fma(qv, vec::load(r + 3 * k.stride + c), a3);
      }
      vec::sum4(a0, a1, a2, a3, scores + t);
    }
  }
  for (; t < k.n; ++t) scores[t] = dot(q, k.data + t * k.stride, D);
}

// Asks for a block's rows ahead of their use, into L1 (Locality 3) or L2 (1). NOTE: the rows of one kv
// head are strided (the other heads' rows lie between them), which the hardware prefetchers follow poorly.
template <int Locality = 3, typename T>
inline void prefetch(Rows<T> rows, int64_t D) {
  for (int64_t t = 0; t < rows.n; ++t) {
    const char* row = reinterpret_cast<const char*>(rows.data + t * rows.stride);
    for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(T)); byte += 64) {
      __builtin_prefetch(row + byte, 0, Locality);
    }
  }
}

// How many blocks ahead rows are prefetched into L2. One block is ~0.2 us of work, less than a DRAM
// access, and L1's few outstanding misses cap what prefetching into it can overlap; three blocks ahead
// into L2 (which tracks many more) measured 1.5-2x faster once K/V outgrow the caches (batch 32 at 512
// and 1024 tokens: 25 GB/s instead of 13), 2 and 6 no better than 3.
constexpr int64_t kL2PrefetchBlocks = 3;

// Calls fn(token, rows) for the rows of one kv head's tokens [first, seq_len), block by block in order
// (token: the first row's), prefetching the next block's rows into L1 and those kL2PrefetchBlocks ahead
// into L2 first. Blocks wholly before `first` (out of a sliding window, perhaps freed) are never read.
template <typename T, typename Index, typename Fn>
inline void for_each_block(const T* cache, const Index* block_table, int64_t first, int64_t seq_len,
                           int64_t kv_head, const Geometry& g, Fn&& fn) {
  const int64_t stride = g.num_kv_heads * g.head_dim;  // between the tokens of a block
  const auto block = [&](int64_t b) {
    const int64_t start = std::max(first, b * g.block_size);
    const int64_t row = static_cast<int64_t>(block_table[b]) * g.block_size + start - b * g.block_size;
    return Rows<T>{cache + row * stride + kv_head * g.head_dim,
                   std::min((b + 1) * g.block_size, seq_len) - start, stride};
  };
  const int64_t first_block = first / g.block_size;
  const int64_t end_block = (seq_len + g.block_size - 1) / g.block_size;
  for (int64_t b = first_block; b < std::min(first_block + kL2PrefetchBlocks, end_block); ++b) {
    prefetch<1>(block(b), g.head_dim);
  }
  prefetch(block(first_block), g.head_dim);
  for (int64_t b = first_block; b < end_block; ++b) {
    if (b + kL2PrefetchBlocks < end_block) prefetch<1>(block(b + kL2PrefetchBlocks), g.head_dim);
    if (b + 1 < end_block) prefetch(block(b + 1), g.head_dim);
    fn(std::max(first, b * g.block_size), block(b));
  }
}

// An fp8 cache's K and V scales (stored = value / scale).
struct Fp8Scales {
  float k;
  float v;
};

// The tokens [first, end) of its request that one query token attends to: up to its own position (end - 1),
// or its image's end (Scoring::ends), from the start or, under a sliding window, from its window's first
// token.
struct Span {
  int64_t first;
  int64_t end;
};

// `rows` (tokens [token, token + rows.n)) narrowed to those within `span` (n <= 0: none).
inline Rows<float> within(Rows<float> rows, int64_t token, Span span) {
  const int64_t from = std::max(token, span.first), to = std::min(token + rows.n, span.end);
  return {rows.data + (from - token) * rows.stride, to - from, rows.stride};
}

// Per-thread buffers, grown to the largest tile a thread meets.
struct Scratch {
  std::vector<float> floats;
  std::vector<Span> spans;  // [Q]
  std::vector<int64_t> scores_at;  // [Q]: where each query's scores start in the scores buffer
};

// Attends Q consecutive query tokens of one request, at positions position0 + i, over one kv head: their G
// query heads each, q[i * q_stride + h * D] (the same layout for out, in q's dtype T). The cache holds C:
// T, bfloat16 for a float32 T, or an fp8 format (`fp8`: its scales). Each block is loaded (and widened)
// once for the tile; each query reads from it the rows it attends to, in the ranges it would alone.
template <typename T, typename C, typename Index>
void attend_tile(const T* q, int64_t q_stride, const C* key_cache, const C* value_cache,
                 const Index* block_table, int64_t row0, int64_t position0, int64_t Q, int64_t kv_head,
                 const Scoring& scoring, const Geometry& g, const Fp8Scales& fp8, Scratch& scratch, T* out) {
  const int64_t G = g.group, D = g.head_dim;
  scratch.spans.resize(Q);
  scratch.scores_at.resize(Q);
  int64_t num_scores = 0;
  for (int64_t i = 0; i < Q; ++i) {
    const int64_t end = position0 + i + 1;
    const int64_t until = scoring.ends == nullptr ? end : std::max(end, scoring.ends[row0 + i]);
    const Span span{scoring.window > 0 ? std::max<int64_t>(0, end - scoring.window) : 0, until};
    scratch.spans[i] = span;
    scratch.scores_at[i] = num_scores;
    num_scores += G * (span.end - span.first);
  }
  const Span* spans = scratch.spans.data();
  const int64_t* scores_at = scratch.scores_at.data();
  scratch.floats.resize(2 * Q * G * D + g.block_size * D + 2 * Q * G + num_scores);
  float* qf = scratch.floats.data();  // [Q, G, D], pre-scaled
  float* acc = qf + Q * G * D;  // [Q, G, D]
  float* block_buffer = acc + Q * G * D;  // [block_size, D]: a block widened to float32
  float* max_score = block_buffer + g.block_size * D;  // [Q, G]
  float* denom = max_score + Q * G;  // [Q, G]
  float* scores = denom + Q * G;  // query i's [G, n_i] at scores_at[i], then the softmax numerators
  for (int64_t i = 0; i < Q; ++i) {
    for (int64_t j = 0; j < G * D; ++j) {
      qf[i * G * D + j] = static_cast<float>(q[i * q_stride + j]) * scoring.scale;
    }
  }
  std::fill(acc, acc + Q * G * D, 0.f);
  // A sink is a score like the others for the max, so the softmax stays max-subtracted.
  const float* sinks = scoring.sinks == nullptr ? nullptr : scoring.sinks + kv_head * G;
  for (int64_t i = 0; i < Q; ++i) {
    for (int64_t h = 0; h < G; ++h) {
      max_score[i * G + h] = sinks == nullptr ? -std::numeric_limits<float>::infinity() : sinks[h];
    }
  }
  // The tile's keys: from the first query's first (spans only move forward: an image's tokens all end
  // at its end, the tokens after it later) to the last query's end.
  const int64_t first = spans[0].first, end = spans[Q - 1].end;

  const float cap = scoring.soft_cap;
  for_each_block(key_cache, block_table, first, end, kv_head, g, [&](int64_t token, Rows<C> rows) {
    const Rows<float> block = widen(rows, D, block_buffer, fp8.k);
    for (int64_t i = 0; i < Q; ++i) {
      const Rows<float> k = within(block, token, spans[i]);
      if (k.n <= 0) continue;
      const int64_t n = spans[i].end - spans[i].first;
      for (int64_t h = 0; h < G; ++h) {
        float* s = scores + scores_at[i] + h * n + std::max(token, spans[i].first) - spans[i].first;
        score_rows(qf + (i * G + h) * D, k, D, s);
        float max = max_score[i * G + h];  // a local: `s` may alias the array, which would pin it in memory
        for (int64_t t = 0; t < k.n; ++t) {
          if (cap > 0.f) s[t] = cap * std::tanh(s[t] / cap);
          max = std::max(max, s[t]);
        }
        max_score[i * G + h] = max;
      }
    }
  });
  for (int64_t i = 0; i < Q; ++i) {
    const int64_t n = spans[i].end - spans[i].first;
    for (int64_t h = 0; h < G; ++h) {
      const float max = max_score[i * G + h];
      denom[i * G + h] = exponentiate(scores + scores_at[i] + h * n, n, max);
      if (sinks != nullptr) denom[i * G + h] += exp_nonpositive(sinks[h] - max);
    }
  }
  for_each_block(value_cache, block_table, first, end, kv_head, g, [&](int64_t token, Rows<C> rows) {
    const Rows<float> block = widen(rows, D, block_buffer, fp8.v);
    for (int64_t i = 0; i < Q; ++i) {
      const Rows<float> v = within(block, token, spans[i]);
      if (v.n <= 0) continue;
      const int64_t n = spans[i].end - spans[i].first;
      const float* p = scores + scores_at[i] + std::max(token, spans[i].first) - spans[i].first;
      accumulate_heads(p, n, v, acc + i * G * D, G, D);
    }
  });
  for (int64_t i = 0; i < Q; ++i) {
    for (int64_t h = 0; h < G; ++h) {
      const float inv = 1.f / denom[i * G + h];  // denom >= 1: the max term (a score or sink) gives exp(0)
      const float* a = acc + (i * G + h) * D;
      T* o = out + i * q_stride + h * D;
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(a[d] * inv);
    }
  }
}

// Consecutive query tokens [begin, end) (rows of q) of one request, attended as one work item per kv head.
struct Tile {
  int64_t request;
  int64_t begin;
  int64_t end;
};

// Query tokens per tile: up to kMaxTile share each K/V block's loads, fewer where their scores would
// outgrow about 1 MiB of scratch (L2). A query's arithmetic does not depend on its tile: this is speed only.
constexpr int64_t kMaxTile = 16;
constexpr int64_t kScoreBudget = int64_t{1} << 18;  // floats

// Each request's query tokens are the last of its tokens: request r's rows [query_start[r],
// query_start[r + 1]) of q sit at positions up to seq_lens[r] - 1.
template <typename T, typename C, typename Index>
void run(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
         const at::Tensor& block_tables, const std::vector<int64_t>& query_start,
         const std::vector<int64_t>& seq_lens, const Scoring& scoring, const Geometry& g,
         const Fp8Scales& fp8, at::Tensor& out) {
  std::vector<Tile> tiles;
  for (int64_t r = 0; r + 1 < static_cast<int64_t>(query_start.size()); ++r) {
    const int64_t length = std::clamp<int64_t>(kScoreBudget / (g.group * seq_lens[r]), 1, kMaxTile);
    for (int64_t begin = query_start[r]; begin < query_start[r + 1]; begin += length) {
      tiles.push_back({r, begin, std::min(begin + length, query_start[r + 1])});
    }
  }
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  const int64_t num_items = num_tiles * g.num_kv_heads;
  const int64_t num_heads = g.num_kv_heads * g.group;
  const T* q_ptr = q.data_ptr<T>();
  const C* k_ptr = static_cast<const C*>(key_cache.data_ptr());
  const C* v_ptr = static_cast<const C*>(value_cache.data_ptr());
  const Index* tables = block_tables.data_ptr<Index>();
  T* out_ptr = out.data_ptr<T>();
  // NOTE: ATen's thread count (torch.set_num_threads), not OpenMP's default, so the kernel uses
  // exactly the threads the matmuls around it use.
#pragma omp parallel num_threads(at::get_num_threads())
  {
    Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      // Last tiles first: the prefill chunks (after the decodes) and their later, longer tiles start early.
      const Tile& tile = tiles[num_tiles - 1 - item / g.num_kv_heads];
      const int64_t kv_head = item % g.num_kv_heads;
      const int64_t position0 = seq_lens[tile.request] - (query_start[tile.request + 1] - tile.begin);
      const int64_t offset = (tile.begin * num_heads + kv_head * g.group) * g.head_dim;
      attend_tile<T, C, Index>(q_ptr + offset, num_heads * g.head_dim, k_ptr, v_ptr,
                               tables + tile.request * g.max_blocks, tile.begin, position0, tile.end - tile.begin,
                               kv_head, scoring, g, fp8, scratch, out_ptr + offset);
    }
  }
}

template <typename T, typename C>
void run_any_index(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                   const at::Tensor& block_tables, const std::vector<int64_t>& query_start,
                   const std::vector<int64_t>& seq_lens, const Scoring& scoring, const Geometry& g,
                   const Fp8Scales& fp8, at::Tensor& out) {
  if (block_tables.scalar_type() == at::kLong) {
    run<T, C, int64_t>(q, key_cache, value_cache, block_tables, query_start, seq_lens, scoring, g, fp8, out);
  } else {
    run<T, C, int32_t>(q, key_cache, value_cache, block_tables, query_start, seq_lens, scoring, g, fp8, out);
  }
}

// Checks everything the threads will index, so no error can arise inside the parallel region.
Geometry check_inputs(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                      const at::Tensor& block_tables, const std::vector<int64_t>& query_start,
                      const std::vector<int64_t>& seq_lens) {
  for (const at::Tensor* t : {&q, &key_cache, &value_cache, &block_tables}) {
    TORCH_CHECK(t->device().is_cpu(), "paged_attention: every tensor must be on the CPU");
  }
  TORCH_CHECK(q.dim() == 3, "q must be [num_tokens, num_heads, head_dim], got ", q.sizes());
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.sizes() == value_cache.sizes(),
              "key_cache and value_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
              "got ", key_cache.sizes(), " and ", value_cache.sizes());
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "the KV caches must be contiguous");
  const bool bf16_for_float = key_cache.scalar_type() == at::kBFloat16 && q.scalar_type() == at::kFloat;
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type() &&
                  (key_cache.scalar_type() == q.scalar_type() || key_cache.scalar_type() == at::kByte ||
                   bf16_for_float),
              "key_cache and value_cache must share q's dtype, be bfloat16 for a float32 q, or both be uint8 "
              "(fp8 bits)");
  const int64_t num_blocks = key_cache.size(0), num_kv_heads = key_cache.size(2);
  const int64_t head_dim = key_cache.size(3), num_heads = q.size(1);
  const int64_t num_requests = static_cast<int64_t>(seq_lens.size());
  TORCH_CHECK(num_kv_heads > 0 && key_cache.size(1) > 0, "the KV caches have no kv heads or an empty block");
  TORCH_CHECK(q.size(2) == head_dim, "q head_dim ", q.size(2), " != cache head_dim ", head_dim);
  TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads ", num_heads,
              " is not a multiple of num_kv_heads ", num_kv_heads);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == num_requests,
              "block_tables must be [num_requests, max_blocks] (one row per seq_lens entry), got ",
              block_tables.sizes());
  TORCH_CHECK(block_tables.scalar_type() == at::kLong || block_tables.scalar_type() == at::kInt,
              "block_tables must be int32 or int64");
  TORCH_CHECK(static_cast<int64_t>(query_start.size()) == num_requests + 1 && query_start[0] == 0 &&
                  query_start[num_requests] == q.size(0),
              "query_start_loc must be [num_requests + 1], from 0 to q's ", q.size(0), " tokens");
  const Geometry g{num_kv_heads, num_heads / num_kv_heads, head_dim, key_cache.size(1), block_tables.size(1)};
  const at::Tensor ids = block_tables.to(at::kLong).contiguous();
  const int64_t* id_ptr = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < num_requests; ++r) {
    const int64_t seq_len = seq_lens[r], num_queries = query_start[r + 1] - query_start[r];
    TORCH_CHECK(seq_len >= 1 && seq_len <= g.max_blocks * g.block_size, "seq_lens[", r, "] = ", seq_len,
                " must be in [1, max_blocks * block_size = ", g.max_blocks * g.block_size, "]");
    TORCH_CHECK(num_queries >= 1 && num_queries <= seq_len, "request ", r, " has ", num_queries,
                " query tokens (query_start_loc); it must have from 1 to its seq_lens entry, ", seq_len);
    for (int64_t b = 0; b < (seq_len + g.block_size - 1) / g.block_size; ++b) {
      const int64_t id = id_ptr[r * g.max_blocks + b];
      TORCH_CHECK(id >= 0 && id < num_blocks, "block_tables[", r, ", ", b, "] = ", id,
                  " is outside the cache's ", num_blocks, " blocks");
    }
  }
  return g;
}

std::vector<int64_t> to_vector(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 1, name, " must be 1-D");
  const at::Tensor values = t.to(at::kCPU, at::kLong).contiguous();
  return {values.data_ptr<int64_t>(), values.data_ptr<int64_t>() + values.numel()};
}

}  // namespace

// q [num_tokens, num_heads, head_dim]; key_cache/value_cache [num_blocks, block_size, num_kv_heads,
// head_dim] (same dtype as q: float32, float16 or bfloat16; bfloat16 for a float32 q (--kv-cache-dtype
// bfloat16); or uint8 fp8 bits of `fp8_format` ("e4m3fn" or "e5m2"; "" for a float cache), stored = value /
// k_scale or v_scale); block_tables [num_requests, max_blocks] int32/int64; query_start_loc
// [num_requests + 1]: request r's query tokens are q's rows [query_start_loc[r], query_start_loc[r + 1]),
// the last of its seq_lens[r] tokens of K/V (this step's already in the cache); each attends up to its own
// position. sliding_window > 0: each query attends only to its last sliding_window tokens; soft_cap > 0:
// scores s become soft_cap * tanh(s / soft_cap); sinks (float32 [num_heads], or an empty tensor: none):
// head h's softmax denominator gains e^sinks[h], a logit with no value (gpt-oss's attention sinks);
// attend_ends (int64 [num_tokens], or an empty tensor: none): a query row whose entry is past its own
// position attends up to that end (its image's tokens, which attend each other both ways: Gemma 3).
// Returns softmax(scale * q k^T) v as [num_tokens, num_heads, head_dim] in q's dtype.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                           const at::Tensor& seq_lens, double scale, int64_t sliding_window, double soft_cap,
                           const std::string& fp8_format, double k_scale, double v_scale,
                           const at::Tensor& sinks, const at::Tensor& attend_ends) {
  TORCH_CHECK(sliding_window >= 0 && soft_cap >= 0, "sliding_window and soft_cap must be >= 0 (0: none)");
  TORCH_CHECK(sinks.numel() == 0 || (sinks.scalar_type() == at::kFloat && sinks.is_contiguous() &&
                                     sinks.dim() == 1 && sinks.size(0) == q.size(1) && sinks.device().is_cpu()),
              "sinks must be empty (none) or a contiguous float32 CPU tensor of q's ", q.size(1),
              " heads, got ", sinks.sizes());
  const std::vector<int64_t> starts = to_vector(query_start_loc, "query_start_loc");
  const std::vector<int64_t> lens = to_vector(seq_lens, "seq_lens");
  const Geometry g = check_inputs(q, key_cache, value_cache, block_tables, starts, lens);
  TORCH_CHECK((key_cache.scalar_type() == at::kByte) != fp8_format.empty(),
              "an fp8 (uint8) KV cache needs fp8_format (\"e4m3fn\" or \"e5m2\"), a float cache none");
  const Fp8Scales fp8{static_cast<float>(k_scale), static_cast<float>(v_scale)};
  const at::Tensor q_c = q.contiguous();
  const at::Tensor tables = block_tables.contiguous();
  at::Tensor out = at::empty_like(q_c);
  const std::vector<int64_t> ends = attend_ends.numel() == 0 ? std::vector<int64_t>{} : to_vector(attend_ends, "attend_ends");
  TORCH_CHECK(ends.empty() || static_cast<int64_t>(ends.size()) == q.size(0),
              "attend_ends must be empty (none) or one entry per query token, ", q.size(0));
  for (int64_t r = 0; !ends.empty() && r < static_cast<int64_t>(lens.size()); ++r) {
    for (int64_t t = starts[r]; t < starts[r + 1]; ++t) {
      TORCH_CHECK(ends[t] <= lens[r], "attend_ends[", t, "] = ", ends[t], " is past its request's ", lens[r],
                  " tokens (seq_lens)");
    }
  }
  const Scoring scoring{static_cast<float>(scale), static_cast<float>(soft_cap), sliding_window,
                        sinks.numel() == 0 ? nullptr : sinks.data_ptr<float>(),
                        ends.empty() ? nullptr : ends.data()};
#define PAGEDSERVE_RUN                                                                              \
  [&] {                                                                                             \
    if (!fp8_format.empty()) {                                                                      \
      vec::with_fp8_format(fp8_format, [&](auto format) {                                           \
        run_any_index<scalar_t, decltype(format)>(q_c, key_cache, value_cache, tables, starts, lens, scoring, g, fp8, out); \
      });                                                                                           \
    } else if (key_cache.scalar_type() != q.scalar_type()) { /* a bfloat16 cache, float32 q */       \
      run_any_index<float, c10::BFloat16>(q_c, key_cache, value_cache, tables, starts, lens, scoring, g, fp8, out); \
    } else {                                                                                        \
      run_any_index<scalar_t, scalar_t>(q_c, key_cache, value_cache, tables, starts, lens, scoring, g, fp8, out); \
    }                                                                                               \
  }
  AT_DISPATCH_SWITCH(q.scalar_type(), "paged_attention",
                     AT_DISPATCH_CASE(at::kFloat, PAGEDSERVE_RUN)
                     AT_DISPATCH_CASE(at::kHalf, PAGEDSERVE_RUN)
                     AT_DISPATCH_CASE(at::kBFloat16, PAGEDSERVE_RUN));
#undef PAGEDSERVE_RUN
  return out;
}

// NOTE: the extension's one Python module: the other sources' pybind11 functions register here too.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  register_decode_inputs(m);
  m.def("paged_attention", &paged_attention,
        "Paged attention of every query token over its request's K/V up to its own position, read in place "
        "through block tables (fp8 bits widened as they are read).",
        py::arg("q"), py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("query_start_loc"), py::arg("seq_lens"), py::arg("scale"), py::arg("sliding_window"),
        py::arg("soft_cap"), py::arg("fp8_format"), py::arg("k_scale"), py::arg("v_scale"),
        py::arg("sinks"), py::arg("attend_ends"));
}
