// The greedy sampler's argmax over float32 logits [rows, vocab]: each row's first index of its largest
// value, or of its first NaN when it has one (numpy's and torch's argmax). A decode step of many rows reads
// megabytes of logits (64 x 49152 float32: 12.6 MB) at the speed one core pulls from memory; rows spread
// over the threads with at::parallel_for read it in about half the time. One pass per row in vector lanes
// (vec.h): each lane keeps its largest value and the first index holding it (only a strictly greater value
// replaces it), in two interleaved accumulators; the lanes are then merged, largest value first and the
// smallest index among equals, and the tail is read one value at a time.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <utility>

#include "vec.h"

namespace {

constexpr int64_t kGrainElements = 1 << 18;  // a row of fewer elements than this per thread stays on one
constexpr int kLanes = vec::kLanes;
using Ints = int32_t __attribute__((vector_size(sizeof(vec::Vec))));  // a lane mask, or lane indices

int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
  }
  return -1;
}

int64_t row_argmax(const float* x, int64_t n) {
  vec::Vec best0 = vec::splat(-INFINITY), best1 = best0;
  Ints index0 = {}, index1 = {}, at0, at1, unordered = {};
  for (int lane = 0; lane < kLanes; ++lane) at0[lane] = lane, at1[lane] = kLanes + lane;
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const vec::Vec a = vec::load(x + i), b = vec::load(x + i + kLanes);
    unordered |= (a != a) | (b != b);
    const Ints greater_a = a > best0, greater_b = b > best1;
    best0 = greater_a ? a : best0, index0 = greater_a ? at0 : index0;
    best1 = greater_b ? b : best1, index1 = greater_b ? at1 : index1;
    at0 += 2 * kLanes, at1 += 2 * kLanes;
  }
  float best = -INFINITY;
  int64_t index = n;  // n: nothing read yet
  bool nan = false;
  for (int lane = 0; lane < kLanes && i > 0; ++lane) {
    nan = nan || unordered[lane] != 0;
    for (const auto& [value, at] : {std::pair{best0[lane], index0[lane]}, std::pair{best1[lane], index1[lane]}}) {
      if (index == n || value > best || (value == best && at < index)) best = value, index = at;
    }
  }
  if (nan) return first_nan(x, n);
  for (; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (index == n || x[i] > best) best = x[i], index = i;
  }
  return index;
}

at::Tensor greedy_argmax(const at::Tensor& logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat,
              "greedy_argmax takes float32 CPU logits, got ", logits.scalar_type(), " on ", logits.device());
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && logits.stride(1) == 1,
              "greedy_argmax takes logits [rows, vocab > 0] with contiguous rows");
  TORCH_CHECK(logits.size(1) <= INT32_MAX, "greedy_argmax takes at most 2^31 - 1 logits a row");
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
