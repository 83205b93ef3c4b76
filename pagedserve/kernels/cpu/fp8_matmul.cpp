// y = x W^T for a weight kept in fp8 (e4m3fn bits, 1 byte per weight) with float32 scales: per output
// row (per-tensor and per-channel checkpoints) or per [row, block of block_k columns] (block-wise).
//
// Batch 1..8 (decode): the weight is read once per call at 1 byte per value, each vector of weights
// widened in registers (vec.h) and multiplied into every activation row; the accumulators stay in
// registers (the batch and the rows per step are template parameters), a block's partial sums are scaled
// when the block ends. Rows are split across threads. Larger batches are compute bound: tiles of rows are
// widened (scaled) into float32 and handed to ATen's GEMM.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "vec_fp8.h"

namespace {

using vec::E4m3fn;
using vec::Vec;
constexpr int W = vec::kLanes;
constexpr int64_t kMaxRegisterBatch = 8;   // above: widened tiles + GEMM
constexpr int64_t kTileFloats = 1 << 18;   // a GEMM tile: 1 MiB of widened weights
constexpr int64_t kGrainWeights = 1 << 14;  // the least work a thread is given

struct Problem {
  const float* x;        // [B, K]
  const E4m3fn* w;       // [N, K]
  const float* scales;   // [N, blocks]
  int64_t batch, n, k, block_k, blocks;
};

// The rows per step for a batch: enough independent accumulators to hide the FMA latency, few enough to
// stay in registers.
constexpr int rows_per_step(int batch) { return batch <= 2 ? 4 : batch <= 4 ? 2 : 1; }

// part[r][i] += w[r] * x row i over one vector of columns (activation rows `x_stride` apart).
template <int kBatch, int kRows>
inline void multiply_rows(Vec (&part)[kRows][kBatch], const Vec (&w)[kRows], const float* x, int64_t x_stride) {
  Vec xv[kBatch];
#pragma GCC unroll 8
  for (int i = 0; i < kBatch; ++i) xv[i] = vec::load(x + i * x_stride);
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int i = 0; i < kBatch; ++i) part[r][i] = vec::fma(w[r], xv[i], part[r][i]);
  }
}

// part[r][i] += widen(weight row r) * x row i over one vector of columns; weight rows `w_stride` apart.
template <int kBatch, int kRows>
inline void accumulate(Vec (&part)[kRows][kBatch], const E4m3fn* w, int64_t w_stride, const float* x,
                       int64_t x_stride) {
  Vec wv[kRows];
  for (int r = 0; r < kRows; ++r) wv[r] = vec::widen(w + r * w_stride);
  multiply_rows<kBatch, kRows>(part, wv, x, x_stride);
}

// The same over two vectors of columns, widened together.
template <int kBatch, int kRows>
inline void accumulate_pair(Vec (&part)[kRows][kBatch], const E4m3fn* w, int64_t w_stride, const float* x,
                            int64_t x_stride) {
  Vec low[kRows], high[kRows];
  for (int r = 0; r < kRows; ++r) vec::widen_pair(w + r * w_stride, low[r], high[r]);
  multiply_rows<kBatch, kRows>(part, low, x, x_stride);
  multiply_rows<kBatch, kRows>(part, high, x + W, x_stride);
}

// y[i, row .. row + kRows) for every activation row i.
template <int kBatch, int kRows>
void rows_times_batch(const Problem& p, int64_t row, float* y) {
  Vec total[kRows][kBatch], part[kRows][kBatch];
  for (auto& per_row : total) std::fill(per_row, per_row + kBatch, Vec{});
  const E4m3fn* w = p.w + row * p.k;
  for (int64_t b = 0; b < p.blocks; ++b) {
    const int64_t start = b * p.block_k, stop = std::min(p.k, start + p.block_k);
    for (auto& per_row : part) std::fill(per_row, per_row + kBatch, Vec{});
    int64_t k = start;
    for (; k + 2 * W <= stop; k += 2 * W) accumulate_pair<kBatch, kRows>(part, w + k, p.k, p.x + k, p.k);
    for (; k + W <= stop; k += W) accumulate<kBatch, kRows>(part, w + k, p.k, p.x + k, p.k);
    if (k < stop) {  // the block's last columns, zero padded to a whole vector
      E4m3fn w_tail[kRows][W] = {};
      float x_tail[kBatch][W] = {};
      for (int r = 0; r < kRows; ++r) std::copy(w + r * p.k + k, w + r * p.k + stop, w_tail[r]);
      for (int i = 0; i < kBatch; ++i) std::copy(p.x + i * p.k + k, p.x + i * p.k + stop, x_tail[i]);
      accumulate<kBatch, kRows>(part, w_tail[0], W, x_tail[0], W);
    }
    for (int r = 0; r < kRows; ++r) {
      const Vec scale = vec::splat(p.scales[(row + r) * p.blocks + b] * E4m3fn::kWidenScale);
      for (int i = 0; i < kBatch; ++i) total[r][i] = vec::fma(part[r][i], scale, total[r][i]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    // a NaN weight makes its output NaN whatever x holds, as in float
    const bool nan_row = vec::has_nan(w + r * p.k, p.k);
    for (int i = 0; i < kBatch; ++i) y[i * p.n + row + r] = nan_row ? NAN : vec::sum(total[r][i]);
  }
}

template <int kBatch>
void small_batch(const Problem& p, float* y) {
  constexpr int kRows = rows_per_step(kBatch);
  const int64_t steps = (p.n + kRows - 1) / kRows;
  const int64_t grain = std::max<int64_t>(1, kGrainWeights / (p.k * kRows));
  at::parallel_for(0, steps, grain, [&](int64_t begin, int64_t end) {
    for (int64_t step = begin; step < end; ++step) {
      const int64_t row = step * kRows;
      if (row + kRows <= p.n) {
        rows_times_batch<kBatch, kRows>(p, row, y);
      } else {  // the last rows, fewer than a step
        for (int64_t r = row; r < p.n; ++r) rows_times_batch<kBatch, 1>(p, r, y);
      }
    }
  });
}

// W[row] * its scales as float32 (exactly fp8 value * scale: the 2^8 of the widening is exact). A row
// holding NaN patterns goes value by value, which reads them as NaN.
void widen_row(const Problem& p, int64_t row, float* out) {
  const E4m3fn* w = p.w + row * p.k;
  const bool vectors = !vec::has_nan(w, p.k);
  for (int64_t b = 0; b < p.blocks; ++b) {
    const float scale_value = p.scales[row * p.blocks + b];
    const Vec scale = vec::splat(scale_value * E4m3fn::kWidenScale);
    const int64_t start = b * p.block_k, stop = std::min(p.k, start + p.block_k);
    int64_t k = start;
    for (; vectors && k + W <= stop; k += W) vec::store(out + k, vec::widen(w + k) * scale);
    for (; k < stop; ++k) out[k] = vec::decode(w[k]) * scale_value;
  }
}

// y^T [N, B], tile by tile: rows widened in parallel, then one GEMM per tile.
void large_batch(const Problem& p, const at::Tensor& x, at::Tensor& y_t) {
  const int64_t tile_rows = std::max<int64_t>(1, kTileFloats / p.k);
  at::Tensor tile = at::empty({std::min(tile_rows, p.n), p.k}, x.options());
  for (int64_t first = 0; first < p.n; first += tile_rows) {
    const int64_t rows = std::min(tile_rows, p.n - first);
    float* tp = tile.data_ptr<float>();
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrainWeights / p.k), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) widen_row(p, first + r, tp + r * p.k);
    });
    at::Tensor out = y_t.narrow(0, first, rows);
    at::mm_out(out, tile.narrow(0, 0, rows), x.t());
  }
}

template <int kBatch>
void dispatch_small(const Problem& p, float* y) {
  if constexpr (kBatch > 1) {
    if (p.batch < kBatch) return dispatch_small<kBatch - 1>(p, y);
  }
  small_batch<kBatch>(p, y);
}

}  // namespace

// x [B, K] float32; weight [N, K] uint8 (e4m3fn bits); scales [N, ceil(K / block_k)] float32 (block_k >= K:
// one scale per row). Returns [B, N] float32.
at::Tensor fp8_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales, int64_t block_k) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be [B, K] float32");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.size(1) == x.size(1),
              "weight must be [N, K] uint8 with x's K = ", x.size(1), ", got ", weight.sizes());
  TORCH_CHECK(block_k > 0, "block_k must be > 0");
  const int64_t B = x.size(0), N = weight.size(0), K = weight.size(1);
  const int64_t blocks = (K + block_k - 1) / block_k;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 2 && scales.size(0) == N &&
                  scales.size(1) == blocks,
              "scales must be [N, ceil(K / block_k)] = [", N, ", ", blocks, "] float32, got ", scales.sizes());
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous(), sc = scales.contiguous();
  if (B == 0 || N == 0 || K == 0) return at::zeros({B, N}, x.options());
  const Problem p{xc.data_ptr<float>(), reinterpret_cast<const E4m3fn*>(wc.data_ptr<uint8_t>()), sc.data_ptr<float>(),
                  B, N, K, block_k, blocks};
  if (B > kMaxRegisterBatch) {
    at::Tensor y_t = at::empty({N, B}, x.options());
    large_batch(p, xc, y_t);
    return y_t.t().contiguous();
  }
  at::Tensor y = at::empty({B, N}, x.options());
  dispatch_small<kMaxRegisterBatch>(p, y.data_ptr<float>());
  return y;
}

// The vector code this build widens fp8 with: "avx512", "avx2" or "scalar" (benchmarks print it).
std::string fp8_matmul_isa() { return vec::kIsa; }

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  m.def("fp8_matmul(Tensor x, Tensor weight, Tensor scales, int block_k) -> Tensor", fp8_matmul);
  m.def("fp8_matmul_isa() -> str", fp8_matmul_isa);
}
