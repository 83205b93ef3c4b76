// The greedy argmax's arithmetic, shared by the standalone kernel (greedy_argmax.cpp) and the LM head's fused
// one (gguf_packed_matmul.cpp): each vector lane keeps the largest value it has seen and the first index
// holding it (only a strictly greater value replaces it, so a lane reading its indices in increasing order
// keeps the first of equals), and whether it saw a NaN. Lanes then merge by the argmax order: the larger
// value, then the smaller index. The answer is numpy's and torch's: the first of equal values, and the first
// NaN if the row has one (the caller finds that one: NaNs are rare, a scan of the row is simple).
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>

#include "vec.h"

namespace argmax {

using Ints = int32_t __attribute__((vector_size(sizeof(vec::Vec))));  // a lane mask, or lane indices

struct Lanes {
  vec::Vec best = vec::splat(-INFINITY);
  Ints index = {};  // NOTE: 0 while no value beat -inf: a row of only -inf has its answer at index 0
  Ints unordered = {};

  void add(vec::Vec values, Ints at) {
    unordered |= values != values;
    const Ints greater = values > best;
    best = greater ? values : best;
    index = greater ? at : index;
  }
};

// The best (value, index) of a row so far; `nan`: some lane saw a NaN.
struct Best {
  float value = -INFINITY;
  int64_t index = -1;  // -1: nothing merged yet
  bool nan = false;

  void merge(float other_value, int64_t other_index) {
    if (index < 0 || other_value > value || (other_value == value && other_index < index))
      value = other_value, index = other_index;
  }
  void merge(const Lanes& lanes) {
    for (int lane = 0; lane < vec::kLanes; ++lane) {
      nan = nan || lanes.unordered[lane] != 0;
      merge(lanes.best[lane], lanes.index[lane]);
    }
  }
  void merge(const Best& other) {
    nan = nan || other.nan;
    if (other.index >= 0) merge(other.value, other.index);
  }
};

inline int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
  }
  return -1;
}

// Each row's argmax of float32 logits [rows, vocab] with contiguous rows (greedy_argmax.cpp): int64 [rows].
at::Tensor greedy_argmax(const at::Tensor& logits);

}  // namespace argmax
