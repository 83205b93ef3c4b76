// y = x W^T for a weight kept in fp8 (e4m3fn bits, 1 byte per weight) with float32 scales: per output
// row (per-tensor and per-channel checkpoints) or per [row, block of block_k columns] (block-wise).
//
// Why a kernel: torch's fp8 -> float32 conversion of a whole weight costs ~100x the float32 matmul it
// feeds on this CPU (benchmarks/quant_kernels.py, "torch fp8 upcast"). Here each row is widened once
// through a 256-entry table into an L1-resident buffer (scale applied), then dotted with every row of x,
// so the weight is read once per call at 1 byte per value and the arithmetic is float32.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

// sum_k a[k] * b[k]; `omp simd` lets the compiler reorder the sum into vector lanes.
inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace

// x [B, K] float32; weight [N, K] uint8 (fp8 bits); scales [N, ceil(K / block_k)] float32 (block_k >= K:
// one scale per row); fp8_values [256] float32 (bit pattern -> value). Returns [B, N] float32.
at::Tensor fp8_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                      const at::Tensor& fp8_values, int64_t block_k) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be [B, K] float32");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.size(1) == x.size(1),
              "weight must be [N, K] uint8 with x's K = ", x.size(1), ", got ", weight.sizes());
  TORCH_CHECK(block_k > 0, "block_k must be > 0");
  const int64_t B = x.size(0), N = weight.size(0), K = weight.size(1);
  const int64_t blocks = (K + block_k - 1) / block_k;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 2 && scales.size(0) == N &&
                  scales.size(1) == blocks,
              "scales must be [N, ceil(K / block_k)] = [", N, ", ", blocks, "] float32, got ", scales.sizes());
  TORCH_CHECK(fp8_values.scalar_type() == at::kFloat && fp8_values.numel() == 256,
              "fp8_values must be 256 float32 values");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous(), sc = scales.contiguous();
  const at::Tensor table = fp8_values.contiguous();
  at::Tensor y = at::empty({B, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const uint8_t* wp = wc.data_ptr<uint8_t>();
  const float* sp = sc.data_ptr<float>();
  const float* values = table.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(K);
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* bits = wp + n * K;
      for (int64_t b = 0; b < blocks; ++b) {
        const float scale = sp[n * blocks + b];
        const int64_t stop = std::min(K, (b + 1) * block_k);
        for (int64_t k = b * block_k; k < stop; ++k) row[k] = values[bits[k]] * scale;
      }
      for (int64_t i = 0; i < B; ++i) yp[i * N + n] = dot(xp + i * K, row.data(), K);
    }
  });
  return y;
}

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  m.def("fp8_matmul(Tensor x, Tensor weight, Tensor scales, Tensor fp8_values, int block_k) -> Tensor",
        fp8_matmul);
}
