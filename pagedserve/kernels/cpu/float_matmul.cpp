// y = x W^T on float weights (float32, or float16 / bfloat16 widened as read) and float32 activations, with
// each output element summed in one order that depends on K alone: whatever the number of rows in the call,
// a row's position among them, its neighbours' values or the thread count, a row's result has the same bits.
// (oneDNN, behind F.linear, picks its kernel and its K split by the number of rows, so a token's logits there
// change with the batch it shares.)
//
// The order: y[m, n] is the dot of x row m and weight row n with one vector accumulator, lane l taking the
// products of columns l, l + W, l + 2W, ... by fused multiply-adds in turn (a last partial vector zero
// padded), then vec::sum's tree over the lanes. Nothing else ever touches the element, so any tiling of the
// (m, n) plane, and any split of it across threads, gives the same bits.
//
// Speed: a micro-tile of kTileRows activation rows by kTileCols weight rows keeps its accumulators in
// registers, each weight vector loaded once for all its rows. Threads take blocks of weight rows (output
// columns), sized to stay in L2 while every activation row passes over them: at decode (a few rows) each
// weight byte is read from memory once per call; at prefill (hundreds of rows) from cache.
#include "float_matmul.h"

#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "vec.h"

namespace {

using vec::Vec;
constexpr int W = vec::kLanes;
#if defined(PAGEDSERVE_VEC_AVX512)
constexpr int kTileRows = 4, kTileCols = 6;  // 24 accumulators of 32 registers
#else
constexpr int kTileRows = 3, kTileCols = 4;  // 12 of 16
#endif
constexpr int64_t kBlockBytes = int64_t{256} << 10;  // a thread's block of weight rows, kept in L2
constexpr int64_t kBlocksPerThread = 4;               // enough blocks to even out the threads' shares

template <typename T>
struct Problem {
  const float* x;  // [rows, k], rows x_stride apart
  const T* w;      // [cols, k]
  float* y;        // [rows, cols]
  int64_t x_stride, rows, cols, k;
};

// acc[i][j] += x row i * weight row j over one vector of columns (rows `x_stride`, `w_stride` apart).
template <typename T, int kRows, int kCols>
inline void multiply_add(Vec (&acc)[kRows][kCols], const float* x, int64_t x_stride, const T* w, int64_t w_stride) {
  Vec wv[kCols];
#pragma GCC unroll 8
  for (int j = 0; j < kCols; ++j) wv[j] = vec::load(w + j * w_stride);
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i) {
    const Vec xv = vec::load(x + i * x_stride);
#pragma GCC unroll 8
    for (int j = 0; j < kCols; ++j) acc[i][j] = vec::fma(xv, wv[j], acc[i][j]);
  }
}

// y[row .. row + kRows, col .. col + kCols).
template <typename T, int kRows, int kCols>
void tile(const Problem<T>& p, int64_t row, int64_t col) {
  Vec acc[kRows][kCols] = {};
  const float* x = p.x + row * p.x_stride;
  const T* w = p.w + col * p.k;
  int64_t c = 0;
  for (; c + W <= p.k; c += W) multiply_add<T, kRows, kCols>(acc, x + c, p.x_stride, w + c, p.k);
  if (c < p.k) {  // the last columns, zero padded to a whole vector
    float x_tail[kRows][W] = {};
    T w_tail[kCols][W] = {};
    for (int i = 0; i < kRows; ++i) std::copy(x + i * p.x_stride + c, x + i * p.x_stride + p.k, x_tail[i]);
    for (int j = 0; j < kCols; ++j) std::copy(w + j * p.k + c, w + j * p.k + p.k, w_tail[j]);
    multiply_add<T, kRows, kCols>(acc, x_tail[0], W, w_tail[0], W);
  }
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kCols; ++j) p.y[(row + i) * p.cols + col + j] = vec::sum(acc[i][j]);
}

// Activation rows [row, row + kRows) times weight rows [begin, end): whole tiles, then the last columns one
// weight row at a time.
template <typename T, int kRows>
void rows_times_block(const Problem<T>& p, int64_t row, int64_t begin, int64_t end) {
  int64_t col = begin;
  for (; col + kTileCols <= end; col += kTileCols) tile<T, kRows, kTileCols>(p, row, col);
  for (; col < end; ++col) tile<T, kRows, 1>(p, row, col);
}

template <typename T>
void block(const Problem<T>& p, int64_t begin, int64_t end) {
  int64_t row = 0;
  for (; row + kTileRows <= p.rows; row += kTileRows) rows_times_block<T, kTileRows>(p, row, begin, end);
  switch (p.rows - row) {  // the last rows, fewer than a tile
    case 3: if constexpr (kTileRows > 3) rows_times_block<T, 3>(p, row, begin, end); break;
    case 2: rows_times_block<T, 2>(p, row, begin, end); break;
    case 1: rows_times_block<T, 1>(p, row, begin, end); break;
    default: break;
  }
}

template <typename T>
void multiply(const Problem<T>& p) {
  const int64_t threads = at::get_num_threads();
  const int64_t fits_cache = kBlockBytes / std::max<int64_t>(1, p.k * int64_t{sizeof(T)});
  const int64_t even_share = (p.cols + threads * kBlocksPerThread - 1) / (threads * kBlocksPerThread);
  const int64_t block_cols = std::max<int64_t>(kTileCols, std::min(fits_cache, even_share) / kTileCols * kTileCols);
  const int64_t blocks = (p.cols + block_cols - 1) / block_cols;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) block(p, b * block_cols, std::min(p.cols, (b + 1) * block_cols));
  });
}

}  // namespace

namespace row_invariant {

void matmul(const float* x, int64_t x_stride, int64_t rows, const void* w, at::ScalarType weight_type, int64_t cols,
            int64_t k, float* y) {
  if (rows == 0 || cols == 0) return;
  switch (weight_type) {
    case at::kFloat:
      return ::multiply(Problem<float>{x, static_cast<const float*>(w), y, x_stride, rows, cols, k});
    case at::kHalf:
      return ::multiply(Problem<c10::Half>{x, static_cast<const c10::Half*>(w), y, x_stride, rows, cols, k});
    case at::kBFloat16:
      return ::multiply(Problem<c10::BFloat16>{x, static_cast<const c10::BFloat16*>(w), y, x_stride, rows, cols, k});
    default: TORCH_CHECK(false, "float_matmul takes float32, float16 or bfloat16 weights, got ", weight_type);
  }
}

}  // namespace row_invariant

// x [M, K] float32 (rows may be apart, columns adjacent); weight [N, K] float32, float16 or bfloat16. Returns
// x W^T [M, N] float32, each element summed in an order that depends on K alone.
at::Tensor float_matmul(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a float32 [M, K] tensor, got ",
              x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1), "weight must be [N, K] with x's K = ", x.size(1),
              ", got ", weight.sizes());
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  const at::Tensor wc = weight.contiguous();
  at::Tensor y = at::empty({x.size(0), weight.size(0)}, x.options());
  row_invariant::matmul(xc.data_ptr<float>(), xc.stride(0), xc.size(0), wc.data_ptr(), wc.scalar_type(), wc.size(0),
                         wc.size(1), y.data_ptr<float>());
  return y;
}

TORCH_LIBRARY_FRAGMENT(pagedserve, m) { m.def("float_matmul(Tensor x, Tensor weight) -> Tensor", float_matmul); }
