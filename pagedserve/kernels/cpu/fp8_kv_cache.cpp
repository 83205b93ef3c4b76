// Writes K/V into an fp8 KV cache (uint8 bits) at their slots: value / scale, saturated at the format's
// largest finite value, rounded to the nearest fp8 value (ties to the even bit pattern), exactly what
// `(x.float() / scale).clamp(-max, max).to(float8)` gives, in one pass instead of four.
//
// The format comes as its 256 values (bit pattern -> float, from torch), so one encoder serves e4m3fn and
// e5m2: codes 0..127 are the non-negative values in increasing order up to the first inf/NaN, bit 7 the
// sign. A value is placed by binary search among the finite ones.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

struct Fp8Format {
  const float* values;  // [256]: values[code]
  int64_t num_finite;  // codes 0..num_finite-1 are finite, non-negative and increasing
};

Fp8Format check_format(const at::Tensor& values) {
  TORCH_CHECK(values.scalar_type() == at::kFloat && values.numel() == 256 && values.is_contiguous(),
              "fp8_values must be the 256 float32 values of an fp8 format's bit patterns");
  const float* v = values.data_ptr<float>();
  int64_t n = 1;
  while (n < 128 && std::isfinite(v[n]) && v[n] > v[n - 1]) ++n;
  TORCH_CHECK(v[0] == 0.f && n > 2, "fp8_values does not start with 0 and increasing finite values");
  return {v, n};
}

inline uint8_t encode(float x, const Fp8Format& f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;  // NaN stays NaN (0x7F is NaN in both formats), as torch casts
  const float a = std::fabs(x);
  const float* v = f.values;
  const int64_t last = f.num_finite - 1;
  if (a >= v[last]) return sign | static_cast<uint8_t>(last);  // saturate
  // the largest code whose value is <= a, then the nearer of it and the next (a tie: the even code)
  const int64_t low = std::upper_bound(v, v + f.num_finite, a) - v - 1;
  // NOTE: exact differences: a lies between two neighbouring fp8 values, within a factor 2 of both
  // (Sterbenz), except next to 0, where the comparison is far from a tie.
  const float below = a - v[low], above = v[low + 1] - a;
  const bool up = above < below || (above == below && (low & 1));
  return sign | static_cast<uint8_t>(up ? low + 1 : low);
}

template <typename T>
void write(const at::Tensor& x, at::Tensor& cache, const int64_t* slots, float scale, const Fp8Format& f) {
  const int64_t tokens = x.size(0), width = x.numel() / std::max<int64_t>(tokens, 1);
  const T* src = x.data_ptr<T>();
  uint8_t* dst = cache.data_ptr<uint8_t>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* row = src + t * width;
      uint8_t* out = dst + slots[t] * width;
      for (int64_t i = 0; i < width; ++i) out[i] = encode(static_cast<float>(row[i]) / scale, f);
    }
  });
}

// key/value [T, num_kv_heads, head_dim] (float32/float16/bfloat16); key_cache/value_cache [num_blocks,
// block_size, num_kv_heads, head_dim] uint8; slot_mapping [T] int64 (block_id * block_size + offset).
void reshape_and_cache_fp8(const at::Tensor& key, const at::Tensor& value, at::Tensor key_cache,
                           at::Tensor value_cache, const at::Tensor& slot_mapping,
                           const at::Tensor& fp8_values, double k_scale, double v_scale) {
  const Fp8Format format = check_format(fp8_values);
  TORCH_CHECK(key_cache.scalar_type() == at::kByte && value_cache.scalar_type() == at::kByte &&
                  key_cache.is_contiguous() && value_cache.is_contiguous() && key_cache.dim() == 4 &&
                  key_cache.sizes() == value_cache.sizes(),
              "key_cache and value_cache must be contiguous uint8 [num_blocks, block_size, num_kv_heads, "
              "head_dim] of one shape");
  const int64_t width = key_cache.size(2) * key_cache.size(3);
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1);
  const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  const int64_t tokens = slots.numel();
  TORCH_CHECK(key.numel() == tokens * width && value.numel() == tokens * width,
              "key and value must hold num_kv_heads * head_dim = ", width, " values for each of the ",
              tokens, " slots");
  const int64_t* slot_ptr = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slot_ptr[t] >= 0 && slot_ptr[t] < num_slots, "slot_mapping[", t, "] = ", slot_ptr[t],
                " is outside the cache's ", num_slots, " slots");
  }
  TORCH_CHECK(k_scale > 0 && v_scale > 0 && std::isfinite(k_scale) && std::isfinite(v_scale),
              "k_scale and v_scale must be finite and > 0");
  const at::Tensor k = key.contiguous().view({tokens, width}), v = value.contiguous().view({tokens, width});
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, k.scalar_type(), "reshape_and_cache_fp8", [&] {
    TORCH_CHECK(v.scalar_type() == k.scalar_type(), "key and value must share one dtype");
    write<scalar_t>(k, key_cache, slot_ptr, static_cast<float>(k_scale), format);
    write<scalar_t>(v, value_cache, slot_ptr, static_cast<float>(v_scale), format);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  m.def(
      "reshape_and_cache_fp8(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping, Tensor fp8_values, float k_scale, float v_scale) -> ()",
      reshape_and_cache_fp8);
}
