// Batched multi-LoRA on CPU (punica's "bgmv"): every token of a batch adds the low-rank update of its own
// adapter to a layer's output, y[t] += B[s] (A[s] x[t]) with s = slots[t]; slot -1 (a base-model request)
// leaves its row alone. B is stored transposed (lora_b [S, R, out]: row r holds B[s][:, r]). Two passes:
//   shrink  h[t] = A[s] x[t]: R dot products of length `in` per token, into a float32 buffer [T, R];
//           parallel over tokens; four rows of A per pass over x (x read once per four), so a prefill's
//           tokens (one slot) stream x past an A[s] that stays in cache.
//   expand  y[t, o] += sum over r of h[t, r] * B^T[s][r][o]: vertical multiply-adds, r ascending. Parallel
//           over (output block, run of consecutive tokens of one slot) pairs, so a block of B^T[s] is read
//           once per run (in L1 across a prefill's tokens) and a decode's many slots still spread over every
//           thread.
// Batch invariance: a token's result is the same bits whatever its batch (its neighbours, their slots, the
// runs, the threads): each token's shrink is its own dot products in one fixed order, and each output of its
// expand one chain of multiply-adds over r; how work is split only decides which thread computes it.
// Sums are float32 (activations and weights widened exactly); the sum y + delta is rounded once to y's
// dtype.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "vec.h"

namespace {

using vec::kLanes;
using vec::Vec;

constexpr int64_t kGrainMacs = 1 << 16;  // multiply-adds below which a call stays on one thread
constexpr int64_t kOutputBlock = 64;     // outputs per expand work item: 4 KiB of a rank-16 float32 B^T[s]
constexpr int64_t kRunTokens = 64;       // tokens per expand work item at most
constexpr int64_t kPanelTokens = 8;      // from this many tokens of one slot the expand copies its block of B^T

// kLanes values of p widened to float32, or the first n of them (n < kLanes) and zeros: no read past a
// row's end, whatever the size.
template <typename T>
inline Vec lanes(const T* p) {
  return vec::load(p);
}

template <typename T>
inline Vec lanes(const T* p, int64_t n) {
  float tail[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) tail[i] = static_cast<float>(p[i]);
  return vec::load(tail);
}

// out[i] = x · w[i] over n values, for four rows w[0..3]: x is read once for the four (in cache, it is
// the rows' loads that bound the loop).
template <typename TX, typename TW>
inline void dot4(const TX* x, const TW* const* w, int64_t n, float* out) {
  Vec acc[4] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec xv = lanes(x + i);
    for (int k = 0; k < 4; ++k) acc[k] = vec::fma(xv, lanes(w[k] + i), acc[k]);
  }
  if (i < n) {
    const Vec xv = lanes(x + i, n - i);
    for (int k = 0; k < 4; ++k) acc[k] = vec::fma(xv, lanes(w[k] + i, n - i), acc[k]);
  }
  vec::sum4(acc[0], acc[1], acc[2], acc[3], out);
}

// out[r] = x · rows[r] for r < count, rows `stride` apart. A last group of fewer than four repeats its
// last row (computed, not stored) rather than taking another code path.
template <typename TX, typename TW>
inline void dot_rows(const TX* x, const TW* rows, int64_t stride, int64_t count, int64_t n, float* out) {
  for (int64_t r = 0; r < count; r += 4) {
    const TW* w[4];
    for (int64_t k = 0; k < 4; ++k) w[k] = rows + std::min(r + k, count - 1) * stride;
    float sums[4];
    dot4(x, w, n, sums);
    std::copy(sums, sums + std::min<int64_t>(4, count - r), out + r);
  }
}

template <typename T, typename TW>
void shrink(const at::Tensor& x, const at::Tensor& lora_a, const int64_t* slots, float* h) {
  const int64_t tokens = x.size(0), in = x.size(1), rank = lora_a.size(1);
  const T* xp = x.data_ptr<T>();
  const TW* ap = lora_a.data_ptr<TW>();
  at::parallel_for(0, tokens, std::max<int64_t>(1, kGrainMacs / (rank * in)), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      if (slots[t] >= 0) dot_rows(xp + t * x.stride(0), ap + slots[t] * rank * in, in, rank, in, h + t * rank);
  });
}

// The batch's tokens that have an adapter, as runs of consecutive tokens of one slot (a prefill chunk is
// one run, cut at kRunTokens; a decode token is mostly a run of its own).
struct Run {
  int64_t first, count;
};

std::vector<Run> runs_of(const int64_t* slots, int64_t tokens) {
  std::vector<Run> runs;
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    if (!runs.empty()) {
      Run& last = runs.back();
      if (last.first + last.count == t && slots[last.first] == slots[t] && last.count < kRunTokens) {
        ++last.count;
        continue;
      }
    }
    runs.push_back({t, 1});
  }
  return runs;
}

// delta[o] = sum over r of h[r] * rows[r][o] for o < count (rows `stride` apart): one multiply-add chain per
// output, r ascending, the same for every output of every block, so the result does not depend on where
// the output's block starts or ends. kFull: a whole block (count = kOutputBlock), its sums in registers;
// else the last block of a row, a partial last vector included.
template <bool kFull, typename TW>
inline void expand_block(const float* h, const TW* rows, int64_t stride, int64_t rank, int64_t count,
                         float* delta) {
  constexpr int64_t kVecs = kOutputBlock / kLanes;
  const int64_t full = kFull ? kVecs : count / kLanes, tail = kFull ? 0 : count % kLanes;
  Vec acc[kVecs] = {};
  for (int64_t r = 0; r < rank; ++r) {
    const Vec hr = vec::splat(h[r]);
    const TW* row = rows + r * stride;
    for (int64_t j = 0; j < full; ++j) acc[j] = vec::fma(hr, lanes(row + j * kLanes), acc[j]);
    if (!kFull && tail) acc[full] = vec::fma(hr, lanes(row + full * kLanes, tail), acc[full]);
  }
  for (int64_t j = 0; j < kVecs; ++j) vec::store(delta + j * kLanes, acc[j]);
}

template <typename TW>
inline void expand_token(const float* h, const TW* rows, int64_t stride, int64_t rank, int64_t count,
                         float* delta) {
  if (count == kOutputBlock) {
    expand_block<true>(h, rows, stride, rank, count, delta);
  } else {
    expand_block<false>(h, rows, stride, rank, count, delta);
  }
}

// panel[r * kOutputBlock + o] = rows[r][o] (rank rows `stride` apart, count values each) as float32.
template <typename TW>
void copy_block(const TW* rows, int64_t stride, int64_t rank, int64_t count, float* panel) {
  for (int64_t r = 0; r < rank; ++r)
    for (int64_t o = 0; o < count; ++o) panel[r * kOutputBlock + o] = static_cast<float>(rows[r * stride + o]);
}

// Work items: (output block, run), block-major. A run of kPanelTokens tokens or more copies its block of
// B^T into a contiguous panel first: rows of B^T are `out` values apart, and at widths a multiple of 1024
// they fall in a few L1 sets. The copy changes no sum (widening is exact, the order is expand_block's),
// so a token's bits stay the same whatever its run.
template <typename T, typename TW>
void expand(at::Tensor& y, const at::Tensor& lora_b, const int64_t* slots, const float* h) {
  const int64_t out = y.size(1), rank = lora_b.size(1);
  const int64_t blocks = (out + kOutputBlock - 1) / kOutputBlock;
  const std::vector<Run> runs = runs_of(slots, y.size(0));
  const int64_t num_runs = static_cast<int64_t>(runs.size());
  if (num_runs == 0) return;
  T* yp = y.data_ptr<T>();
  const TW* bp = lora_b.data_ptr<TW>();
  const int64_t grain = std::max<int64_t>(1, kGrainMacs / (kOutputBlock * rank));
  at::parallel_for(0, blocks * num_runs, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> panel;
    float delta[kOutputBlock];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t block = item / num_runs, first = block * kOutputBlock;
      const int64_t count = std::min(kOutputBlock, out - first);
      const Run run = runs[item % num_runs];
      const TW* rows = bp + slots[run.first] * rank * out + first;
      const bool copied = run.count >= kPanelTokens;
      if (copied) {
        panel.resize(rank * kOutputBlock);
        copy_block(rows, out, rank, count, panel.data());
      }
      for (int64_t t = run.first; t < run.first + run.count; ++t) {
        if (copied) {
          expand_token(h + t * rank, panel.data(), kOutputBlock, rank, count, delta);
        } else {
          expand_token(h + t * rank, rows, out, rank, count, delta);
        }
        T* row = yp + t * y.stride(0) + first;
        for (int64_t o = 0; o < count; ++o) row[o] = static_cast<T>(static_cast<float>(row[o]) + delta[o]);
      }
    }
  });
}

// The slots as int64, each checked against the number of adapters.
at::Tensor checked_slots(const at::Tensor& slots, int64_t tokens, int64_t adapters) {
  TORCH_CHECK(slots.device().is_cpu(), "slots must be a CPU tensor");
  TORCH_CHECK(slots.scalar_type() == at::kInt || slots.scalar_type() == at::kLong,
              "slots must be int32 or int64, got ", slots.scalar_type());
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == tokens, "slots must be [", tokens, "] (one per token), got ",
              slots.sizes());
  at::Tensor slots64 = slots.to(at::kLong).contiguous();
  const int64_t* sp = slots64.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(sp[t] >= -1 && sp[t] < adapters, "slots[", t, "] = ", sp[t], " is outside [-1, ", adapters, ")");
  return slots64;
}

void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got one on ", t.device());
}

template <typename T, typename TW>
void add_lora_typed(at::Tensor& y, const at::Tensor& x, const at::Tensor& lora_a, const at::Tensor& lora_b,
                    const int64_t* slots) {
  at::Tensor h = at::empty({y.size(0), lora_a.size(1)}, x.options().dtype(at::kFloat));
  shrink<T, TW>(x, lora_a, slots, h.data_ptr<float>());
  expand<T, TW>(y, lora_b, slots, h.data_ptr<float>());
}

// The activations' dtype T, the weights' float32 or T.
template <typename T>
void add_lora_weights(at::Tensor& y, const at::Tensor& x, const at::Tensor& lora_a, const at::Tensor& lora_b,
                      const int64_t* slots) {
  if (lora_a.scalar_type() == at::kFloat) {
    add_lora_typed<T, float>(y, x, lora_a, lora_b, slots);
  } else {
    add_lora_typed<T, T>(y, x, lora_a, lora_b, slots);
  }
}

// y [T, out] += per token t with slots[t] >= 0: lora_b[s]^T (lora_a[s] x[t]), s = slots[t]. y and x: float32,
// bfloat16 or float16, one dtype, rows contiguous (stride 1 along the last dimension); lora_a [S, R, in] and
// lora_b [S, R, out] (B transposed): contiguous, float32 or y's dtype; slots [T] int32 or int64, each in [-1, S).
void add_lora(at::Tensor& y, const at::Tensor& x, const at::Tensor& lora_a, const at::Tensor& lora_b,
              const at::Tensor& slots) {
  check_cpu(y, "y");
  check_cpu(x, "x");
  check_cpu(lora_a, "lora_a");
  check_cpu(lora_b, "lora_b");
  TORCH_CHECK(y.dim() == 2 && x.dim() == 2 && x.size(0) == y.size(0),
              "y and x must be [T, out] and [T, in] with the same T, got ", y.sizes(), " and ", x.sizes());
  TORCH_CHECK(y.stride(1) == 1 && x.stride(1) == 1,
              "y's and x's rows must be contiguous (stride 1 along the last dimension)");
  TORCH_CHECK(lora_a.dim() == 3 && lora_b.dim() == 3 && lora_a.size(0) == lora_b.size(0) &&
                  lora_a.size(1) == lora_b.size(1) && lora_a.size(2) == x.size(1) && lora_b.size(2) == y.size(1),
              "lora_a and lora_b must be [S, R, in] and [S, R, out] with in = ", x.size(1), ", out = ",
              y.size(1), ", got ", lora_a.sizes(), " and ", lora_b.sizes());
  TORCH_CHECK(lora_a.is_contiguous() && lora_b.is_contiguous(), "lora_a and lora_b must be contiguous");
  const at::ScalarType dtype = y.scalar_type(), weights = lora_a.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "y must be float32, bfloat16 or float16, got ", dtype);
  TORCH_CHECK(x.scalar_type() == dtype, "x's dtype ", x.scalar_type(), " differs from y's ", dtype);
  TORCH_CHECK(lora_b.scalar_type() == weights && (weights == at::kFloat || weights == dtype),
              "lora_a and lora_b must both be float32 or both y's dtype ", dtype, ", got ", weights, " and ",
              lora_b.scalar_type());
  const at::Tensor slots64 = checked_slots(slots, y.size(0), lora_a.size(0));
  if (y.numel() == 0 || lora_a.size(1) == 0) return;
  const int64_t* sp = slots64.data_ptr<int64_t>();
  if (dtype == at::kFloat) {
    add_lora_weights<float>(y, x, lora_a, lora_b, sp);
  } else if (dtype == at::kBFloat16) {
    add_lora_weights<c10::BFloat16>(y, x, lora_a, lora_b, sp);
  } else {
    add_lora_weights<c10::Half>(y, x, lora_a, lora_b, sp);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  m.def("add_lora(Tensor(a!) y, Tensor x, Tensor lora_a, Tensor lora_b, Tensor slots) -> ()", add_lora);
}
