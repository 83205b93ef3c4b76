// The greedy sampler's argmax over float32 logits [rows, vocab]: each row's first index of its largest
// value, or of its first NaN when it has one (numpy's and torch's argmax). A decode step of many rows reads
// megabytes of logits (64 x 49152 float32: 12.6 MB) at the speed one core pulls from memory; rows spread
// over the threads with at::parallel_for read it in about half the time. One row at a time in two passes:
// the largest value (and whether any is NaN) with four vector accumulators, then the first index holding
// it, which reads the row again from cache.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kGrainElements = 1 << 18;  // a row of fewer elements than this per thread stays on one

int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
  }
  return -1;
}

#if defined(__AVX512F__)
int64_t row_argmax(const float* x, int64_t n) {
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  __mmask16 unordered = 0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    const __m512 c = _mm512_loadu_ps(x + i + 32), d = _mm512_loadu_ps(x + i + 48);
    unordered |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, d, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(m0, a), m1 = _mm512_max_ps(m1, b), m2 = _mm512_max_ps(m2, c), m3 = _mm512_max_ps(m3, d);
  }
  float best = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
  bool nan = unordered != 0;
  for (int64_t j = i; j < n; ++j) {
    nan = nan || std::isnan(x[j]);
    best = x[j] > best ? x[j] : best;
  }
  if (nan) return first_nan(x, n);
  const __m512 target = _mm512_set1_ps(best);
  for (i = 0; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), target, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < n && x[i] != best; ++i) {
  }
  return i;
}
#elif defined(__AVX2__)
int64_t row_argmax(const float* x, int64_t n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  __m256 unordered = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    const __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
    unordered = _mm256_or_ps(unordered, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q)));
    m0 = _mm256_max_ps(m0, a), m1 = _mm256_max_ps(m1, b), m2 = _mm256_max_ps(m2, c), m3 = _mm256_max_ps(m3, d);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  float best = -INFINITY;
  for (float lane : lanes) best = lane > best ? lane : best;
  bool nan = _mm256_movemask_ps(unordered) != 0;
  for (int64_t j = i; j < n; ++j) {
    nan = nan || std::isnan(x[j]);
    best = x[j] > best ? x[j] : best;
  }
  if (nan) return first_nan(x, n);
  const __m256 target = _mm256_set1_ps(best);
  for (i = 0; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < n && x[i] != best; ++i) {
  }
  return i;
}
#else
int64_t row_argmax(const float* x, int64_t n) {
  int64_t index = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[index]) index = i;
  }
  return index;
}
#endif

at::Tensor greedy_argmax(const at::Tensor& logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat,
              "greedy_argmax takes float32 CPU logits, got ", logits.scalar_type(), " on ", logits.device());
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && logits.stride(1) == 1,
              "greedy_argmax takes logits [rows, vocab > 0] with contiguous rows");
  const int64_t rows = logits.size(0), vocab = logits.size(1), stride = logits.stride(0);
  at::Tensor out = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* x = logits.data_ptr<float>();
  int64_t* ids = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / vocab), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) ids[row] = row_argmax(x + row * stride, vocab);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedserve, m) { m.def("greedy_argmax(Tensor logits) -> Tensor", greedy_argmax); }
