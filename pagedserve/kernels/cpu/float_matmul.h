// The row-invariant float matmul (float_matmul.cpp) for the kernels that hand it float weights (GGUF's F32
// and F16 tensors).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace row_invariant {

// y[m, n] = sum_k x[m, k] * w[n, k] for m < rows, n < cols: x float32 rows `x_stride` floats apart, w [cols, k]
// contiguous in `weight_type` (float32, float16 or bfloat16), y [rows, cols] contiguous float32. Every element is
// summed in one order that depends on k alone (float_matmul.cpp says which).
void matmul(const float* x, int64_t x_stride, int64_t rows, const void* w, at::ScalarType weight_type, int64_t cols,
            int64_t k, float* y);

}  // namespace row_invariant
