// Writes K/V into an fp8 KV cache (uint8 bits) at their slots: value / scale, saturated at the format's
// largest finite value, rounded to the nearest fp8 value (ties to the even bit pattern), exactly what
// `(x.float() / scale).clamp(-max, max).to(float8)` gives (vec.h's encode), in one pass instead of four.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec_fp8.h"

namespace {

template <typename T, typename F>
void write(const at::Tensor& x, at::Tensor& cache, const int64_t* slots, float scale) {
  const int64_t tokens = x.size(0), width = x.numel() / std::max<int64_t>(tokens, 1);
  const T* src = x.data_ptr<T>();
  F* dst = reinterpret_cast<F*>(cache.data_ptr<uint8_t>());
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* row = src + t * width;
      F* out = dst + slots[t] * width;
      for (int64_t i = 0; i < width; ++i) out[i] = vec::encode<F>(static_cast<float>(row[i]) / scale);
    }
  });
}

// key/value [T, num_kv_heads, head_dim] (float32/float16/bfloat16); key_cache/value_cache [num_blocks,
// block_size, num_kv_heads, head_dim] uint8; slot_mapping [T] int64 (block_id * block_size + offset);
// fp8_format "e4m3fn" or "e5m2".
void reshape_and_cache_fp8(const at::Tensor& key, const at::Tensor& value, at::Tensor key_cache,
                           at::Tensor value_cache, const at::Tensor& slot_mapping,
                           const std::string& fp8_format, double k_scale, double v_scale) {
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
  TORCH_CHECK(v.scalar_type() == k.scalar_type(), "key and value must share one dtype");
  vec::with_fp8_format(fp8_format, [&](auto format) {
    using F = decltype(format);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, k.scalar_type(), "reshape_and_cache_fp8", [&] {
      write<scalar_t, F>(k, key_cache, slot_ptr, static_cast<float>(k_scale));
      write<scalar_t, F>(v, value_cache, slot_ptr, static_cast<float>(v_scale));
    });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  m.def(
      "reshape_and_cache_fp8(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping, str fp8_format, float k_scale, float v_scale) -> ()",
      reshape_and_cache_fp8);
}
