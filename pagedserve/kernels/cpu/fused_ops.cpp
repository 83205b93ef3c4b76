// Fused element-wise kernels of a decoder layer on CPU: RMSNorm (with the residual add, and Gemma's
// (1 + w) scale), rotary embedding in place on q and k, and the gated activations SiLU·mul and
// GELU-tanh·mul. Each replaces several torch ops (and as many passes over memory and dispatches) by one.
//
// Rounding follows the torch layers they replace (pagedserve/layers): every value the torch code
// materializes in the activations' dtype (bfloat16, float16) is rounded to it here at the same point, so
// the results are the torch layers' up to float32 summation order. Rows are spread over threads with
// at::parallel_for; a grain of many elements keeps one decode's few rows on the calling thread (no
// thread wake-ups for microseconds of work).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "vec.h"

namespace {

constexpr int64_t kGrainElements = 1 << 16;  // below this many elements a call stays on one thread

// v as the storage type T would hold it: the rounding a torch op in T makes when it writes its result.
template <typename T>
inline float rounded(float v) {
  return static_cast<float>(static_cast<T>(v));
}

int64_t grain_rows(int64_t width) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(width, 1)); }

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(x.dim() == 2, name, " must be 2-D [rows, width], got ", x.dim(), "-D");
  TORCH_CHECK(x.stride(1) == 1, name, "'s rows must be contiguous (stride 1 along the last dimension)");
}

// ---- RMSNorm ------------------------------------------------------------------------------------------

// out = norm(x) * w, or with `offset` (Gemma) norm(x) * (1 + w) taken in float32 before the rounding.
template <typename T>
void rms_norm_row(const T* x, T* out, const T* w, int64_t n, float eps, bool offset) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
  if (offset) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(static_cast<float>(x[i]) * inv * (1.f + static_cast<float>(w[i])));
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(static_cast<float>(w[i]) * rounded<T>(static_cast<float>(x[i]) * inv));
  }
}

void check_norm(const at::Tensor& x, const at::Tensor& weight) {
  check_rows(x, "x");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(),
              "weight must be contiguous [", x.size(1), "], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight's dtype ", weight.scalar_type(),
              " differs from x's ", x.scalar_type());
}

// x [rows, n] -> a new [rows, n] tensor norm(x) * w.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool offset) {
  check_norm(x, weight);
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t rows = x.size(0), n = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        rms_norm_row(xp + r * x.stride(0), op + r * n, wp, n, static_cast<float>(eps), offset);
    });
  });
  return out;
}

// residual <- x + residual (rounded to the dtype, as torch's add), then x <- norm(residual) * w.
template <typename T>
void add_rms_norm_row(T* x, T* residual, const T* w, int64_t n, float eps, bool offset) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) residual[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(residual[i]));
  rms_norm_row<T>(residual, x, w, n, eps, offset);
}

// vLLM's fused_add_rms_norm, in place on x and residual [rows, n].
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps,
                        bool offset) {
  check_norm(x, weight);
  check_rows(residual, "residual");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "residual must match x: ", x.sizes(), " ", x.scalar_type(), ", got ", residual.sizes(), " ",
              residual.scalar_type());
  const int64_t rows = x.size(0), n = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_add_rms_norm", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* rp = residual.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        add_rms_norm_row(xp + r * x.stride(0), rp + r * residual.stride(0), wp, n, static_cast<float>(eps), offset);
    });
  });
}

// ---- rotary embedding ---------------------------------------------------------------------------------

// One head's first rotary_dim values rotated by (cos, sin) [rotary_dim / 2]: neox pairs i with
// i + rotary_dim / 2, GPT-J pairs 2i with 2i + 1. cos and sin are rounded to T first, as the torch layer
// casts them; each product and the sum are rounded as torch's element-wise ops do.
template <typename T>
inline void rotate_head(T* x, const float* cos, const float* sin, int64_t half, bool neox) {
  const int64_t step = neox ? 1 : 2, partner = neox ? half : 1;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    T* a = x + i * step;
    T* b = a + partner;
    const float c = rounded<T>(cos[i]), s = rounded<T>(sin[i]);
    const float x1 = static_cast<float>(*a), x2 = static_cast<float>(*b);
    *a = static_cast<T>(rounded<T>(x1 * c) + rounded<T>(-x2 * s));
    *b = static_cast<T>(rounded<T>(x2 * c) + rounded<T>(x1 * s));
  }
}

template <typename T>
void rotate_rows(const int64_t* positions, at::Tensor& x, int64_t head_dim, const float* cos,
                 const float* sin, int64_t half, bool neox) {
  const int64_t tokens = x.size(0), heads = x.size(1) / head_dim, row_stride = x.stride(0);
  T* base = x.data_ptr<T>();
  at::parallel_for(0, tokens, grain_rows(x.size(1)), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos + positions[t] * half;
      const float* s = sin + positions[t] * half;
      for (int64_t h = 0; h < heads; ++h) rotate_head(base + t * row_stride + h * head_dim, c, s, half, neox);
    }
  });
}

// query [T, num_heads * head_dim], key [T, num_kv_heads * head_dim] (rows may be strided views of a
// fused qkv output), rotated in place at positions [T]; cos_cache/sin_cache [max_position, rotary_dim / 2]
// float32. The last head_dim - rotary_dim values of each head pass through (partial rotary).
void rotary_embedding(const at::Tensor& positions, at::Tensor& query, at::Tensor& key, int64_t head_dim,
                      const at::Tensor& cos_cache, const at::Tensor& sin_cache, bool neox) {
  check_rows(query, "query");
  check_rows(key, "key");
  TORCH_CHECK(query.scalar_type() == key.scalar_type(), "query and key must share a dtype");
  TORCH_CHECK(cos_cache.scalar_type() == at::kFloat && sin_cache.scalar_type() == at::kFloat &&
                  cos_cache.is_contiguous() && sin_cache.is_contiguous() && cos_cache.dim() == 2 &&
                  cos_cache.sizes() == sin_cache.sizes(),
              "cos_cache and sin_cache must be contiguous float32 [max_position, rotary_dim / 2]");
  const int64_t half = cos_cache.size(1), max_position = cos_cache.size(0);
  TORCH_CHECK(head_dim > 0 && 2 * half <= head_dim, "rotary_dim ", 2 * half, " must be in (0, head_dim ",
              head_dim, "]");
  TORCH_CHECK(query.size(1) % head_dim == 0 && key.size(1) % head_dim == 0,
              "query and key widths must be multiples of head_dim ", head_dim);
  const at::Tensor pos = positions.to(at::kLong).contiguous();
  TORCH_CHECK(pos.dim() == 1 && pos.size(0) == query.size(0) && key.size(0) == query.size(0),
              "positions [", pos.numel(), "] must have one entry per query and key row (", query.size(0), ")");
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < pos.size(0); ++t)
    TORCH_CHECK(pp[t] >= 0 && pp[t] < max_position, "positions[", t, "] = ", pp[t],
                " is outside the rotary cache's [0, ", max_position, ")");
  const float* cp = cos_cache.data_ptr<float>();
  const float* sp = sin_cache.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "rotary_embedding", [&] {
    rotate_rows<scalar_t>(pp, query, head_dim, cp, sp, half, neox);
    rotate_rows<scalar_t>(pp, key, head_dim, cp, sp, half, neox);
  });
}

// ---- gated activations --------------------------------------------------------------------------------

// Truncation to integers and back to floats, on a float or on vec::Vec lanes. NOTE: overloads on concrete
// types: GCC drops vector_size from a type that depends on a template parameter.
using VecInts = int32_t __attribute__((vector_size(sizeof(vec::Vec))));
inline int32_t truncated(float v) { return static_cast<int32_t>(v); }
inline VecInts truncated(vec::Vec v) { return __builtin_convertvector(v, VecInts); }
inline float float_lanes(int32_t i) { return static_cast<float>(i); }
inline vec::Vec float_lanes(VecInts i) { return __builtin_convertvector(i, vec::Vec); }

// e^x on a float or on vec::Vec lanes, in plain arithmetic so it vectorizes without libm or -ffast-math:
// x = n ln2 + r (Cody-Waite, ln2 in two parts), e^r by its Taylor series to r^7 (|r| <= ln2 / 2: the
// remainder is below 1e-8 relative), times 2^n built in the exponent bits. x is clamped to [-87, 88],
// float's normal range; NaN stays NaN. NOTE: written on vector lanes, not left to GCC's vectorizer: its
// loop over the scalar form ran at ~14 cycles an element (a Xeon, GCC 12).
template <typename V>
inline V exp_clamped(V x) {
  const V lowest = V{} - 87.f, highest = V{} + 88.f;
  x = x < lowest ? lowest : x;
  x = x > highest ? highest : x;
  // floor(x log2(e) + 1/2) by truncation, made positive first (the clamp keeps it above -126)
  const auto n_int = truncated(x * 1.4426950409f + 128.5f) - 128;
  const V n = float_lanes(n_int);
  const V r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-6f;
  const V series =
      1.f + r * (1.f + r * (0.5f + r * (1.f / 6 + r * (1.f / 24 + r * (1.f / 120 + r * (1.f / 720 + r / 5040))))));
  const auto bits = (n_int + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return series * scale;
}

struct Silu {
  template <typename V>
  static V apply(V g) {
    return g / (1.f + exp_clamped(-g));
  }
};

// HF's gelu_pytorch_tanh: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), tanh(y) = 1 - 2 / (e^2y + 1).
struct GeluTanh {
  template <typename V>
  static V apply(V g) {
    const V y = 0.7978845608f * (g + 0.044715f * g * g * g);
    return 0.5f * g * (2.f - 2.f / (exp_clamped(2.f * y) + 1.f));
  }
};

// One row: out[i] = act(gate[i]) * up[i], act's result rounded to the dtype before the product (torch
// materializes it). float32 rows a vector of lanes at a time (no rounding to make).
template <typename Act, typename T>
void gated_row(const T* gate, const T* up, T* out, int64_t d) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>)
    for (; i + vec::kLanes <= d; i += vec::kLanes)
      vec::store(out + i, Act::apply(vec::load(gate + i)) * vec::load(up + i));
  for (; i < d; ++i)
    out[i] = static_cast<T>(rounded<T>(Act::apply(static_cast<float>(gate[i]))) * static_cast<float>(up[i]));
}

// x [rows, 2d] -> [rows, d]: act(x[:, :d]) * x[:, d:].
template <typename Act>
at::Tensor gated(const at::Tensor& x, const char* name) {
  check_rows(x, "x");
  TORCH_CHECK(x.size(1) % 2 == 0, name, ": the last dimension (", x.size(1), ") must be even: [gate, up]");
  const int64_t rows = x.size(0), d = x.size(1) / 2;
  at::Tensor out = at::empty({rows, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "gated_activation", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain_rows(2 * d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        gated_row<Act>(xp + r * x.stride(0), xp + r * x.stride(0) + d, op + r * d, d);
    });
  });
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& x) { return gated<Silu>(x, "silu_and_mul"); }

at::Tensor gelu_tanh_and_mul(const at::Tensor& x) { return gated<GeluTanh>(x, "gelu_tanh_and_mul"); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, bool offset) -> Tensor", rms_norm);
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps, bool offset) -> ()",
        fused_add_rms_norm);
  m.def(
      "rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_dim, Tensor cos_cache, "
      "Tensor sin_cache, bool neox) -> ()",
      rotary_embedding);
  m.def("silu_and_mul(Tensor x) -> Tensor", silu_and_mul);
  m.def("gelu_tanh_and_mul(Tensor x) -> Tensor", gelu_tanh_and_mul);
}
