"""reshape_and_cache: write each new token's K and V into its slot of the paged cache."""

import torch
import triton
import triton.language as tl


# NOTE: untyped: triton ships no types, and @triton.jit compiles this source (tl.constexpr marks only).
@triton.jit  # type: ignore[untyped-decorator]
def _reshape_and_cache_kernel(  # type: ignore[no-untyped-def]
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    k_scale,
    v_scale,
    fp8_max,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANTIZE: tl.constexpr,
):
    """One program per (token, kv head). A negative slot is a padding token (CUDA-graph batches): skipped."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    # NOTE: the slot test is broadcast to a vector first: Triton's interpreter gives `vector & scalar`
    # a dtype tl.load rejects as a mask.
    mask = (d < HEAD_DIM) & (tl.zeros([BLOCK_D], dtype=tl.int64) + slot >= 0)
    slot = tl.maximum(slot, 0)
    k = tl.load(key_ptr + token * stride_k_token + head * stride_k_head + d, mask=mask, other=0.0)
    v = tl.load(value_ptr + token * stride_v_token + head * stride_v_head + d, mask=mask, other=0.0)
    if QUANTIZE:  # fp8 KV cache: store value / scale, saturated (no inf/NaN); attention multiplies it back
        k = tl.minimum(tl.maximum(k.to(tl.float32) / k_scale, -fp8_max), fp8_max)
        v = tl.minimum(tl.maximum(v.to(tl.float32) / v_scale, -fp8_max), fp8_max)
    dst = (
        (slot // BLOCK_SIZE) * stride_cache_block
        + (slot % BLOCK_SIZE) * stride_cache_slot
        + head * stride_cache_head
        + d
    )
    tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """key/value [T, num_kv_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads, head_dim];
    token i goes to slot slot_mapping[i] (block_id * block_size + offset; < 0: skip). An fp8 cache (a
    float8 dtype: view a uint8 cache as its format first) stores key / k_scale and value / v_scale,
    saturated at the format's largest value."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert key_cache.stride(-1) == 1 and key.stride(-1) == 1 and value.stride(-1) == 1
    assert key_cache.stride() == value_cache.stride()
    quantize = key_cache.dtype.itemsize == 1
    fp8_max = torch.finfo(key_cache.dtype).max if quantize else 0.0
    _reshape_and_cache_kernel[(num_tokens, num_kv_heads)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        k_scale,
        v_scale,
        fp8_max,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        BLOCK_SIZE=key_cache.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        QUANTIZE=quantize,
    )
