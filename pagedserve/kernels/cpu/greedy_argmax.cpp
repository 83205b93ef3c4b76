// The greedy sampler's argmax over float32 logits [rows, vocab]: each row's first index of its largest
// value, or of its first NaN when it has one (numpy's and torch's argmax). A decode step of many rows reads
// megabytes of logits (64 x 49152 float32: 12.6 MB) at the speed one core pulls from memory; rows spread
// over the threads with at::parallel_for read it in about half the time. One pass per row in vector lanes
// (argmax_lanes.h), two interleaved accumulators so the compares pipeline; the tail is read one value at a
// time. The LM head's kernel does the same a group of rows at a time where it can (gguf_packed_matmul.cpp).
#include "argmax_lanes.h"

#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>

namespace argmax {

namespace {

constexpr int64_t kGrainElements = 1 << 18;  // a row of fewer elements than this per thread stays on one
constexpr int kLanes = vec::kLanes;

int64_t row_argmax(const float* x, int64_t n) {
  Lanes even, odd;
  Ints at0, at1;
  for (int lane = 0; lane < kLanes; ++lane) at0[lane] = lane, at1[lane] = kLanes + lane;
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    even.add(vec::load(x + i), at0);
    odd.add(vec::load(x + i + kLanes), at1);
    at0 += 2 * kLanes, at1 += 2 * kLanes;
  }
  Best best;
  if (i > 0) best.merge(even), best.merge(odd);
  if (best.nan) return first_nan(x, n);
  for (; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (best.index < 0 || x[i] > best.value) best.value = x[i], best.index = i;
  }
  return best.index;
}

}  // namespace

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

}  // namespace argmax

TORCH_LIBRARY_FRAGMENT(pagedserve, m) { m.def("greedy_argmax(Tensor logits) -> Tensor", argmax::greedy_argmax); }
