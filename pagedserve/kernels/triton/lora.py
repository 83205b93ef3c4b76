"""Batched multi-LoRA (punica's "bgmv"): y[t] += lora_b[s] (lora_a[s] x[t]), s = slots[t], for a batch
whose tokens use different adapters; slot -1 (a base-model token) leaves its row alone.

Two kernels, one program per token (times a block of outputs for the second): shrink h[t] = lora_a[s] x[t]
into a float32 buffer [T, R], then expand y[t] += lora_b[s]^T h[t] (lora_b stored transposed, [S, R, out]).
Sums are float32; y + update is rounded once to y's dtype. Every size is masked (odd in/out, any rank up to
a power-of-two block). Batch invariant: a token's program does the same sums in the same order whatever the
rest of the batch (block sizes depend on the layer's rank alone, never on the number of tokens).
"""

import torch
import triton
import triton.language as tl

BLOCK_IN = 64  # x values per step of the shrink
BLOCK_OUT = 64  # outputs per program of the expand


# NOTE: untyped: triton ships no types, and @triton.jit compiles this source (tl.constexpr marks only).
@triton.jit  # type: ignore[untyped-decorator]
def _lora_shrink_kernel(  # type: ignore[no-untyped-def]
    h_ptr,
    x_ptr,
    lora_a_ptr,
    slots_ptr,
    in_features,
    stride_x_token,
    RANK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One program per token: h[t, r] = lora_a[s, r] · x[t] for r < RANK."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    r = tl.arange(0, BLOCK_R)
    # NOTE: the slot test is broadcast to a vector first: Triton's interpreter gives `vector & scalar`
    # a dtype tl.load rejects as a mask.
    r_valid = (r < RANK) & (tl.zeros([BLOCK_R], dtype=tl.int64) + slot >= 0)
    a_rows = lora_a_ptr + (tl.maximum(slot, 0) * RANK + r[:, None]) * in_features
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_valid = k < in_features
        x = tl.load(x_ptr + token * stride_x_token + k, mask=k_valid, other=0.0)
        a = tl.load(a_rows + k[None, :], mask=r_valid[:, None] & k_valid[None, :], other=0.0)
        acc += tl.sum(a.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(h_ptr + token * RANK + r, acc, mask=r_valid)


@triton.jit  # type: ignore[untyped-decorator]
def _lora_expand_kernel(  # type: ignore[no-untyped-def]
    y_ptr,
    h_ptr,
    lora_b_ptr,
    slots_ptr,
    out_features,
    stride_y_token,
    RANK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program per (token, block of outputs): y[t, n] += lora_b[s, :, n] · h[t]."""
    token = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    n_valid = (n < out_features) & (tl.zeros([BLOCK_N], dtype=tl.int64) + slot >= 0)
    r = tl.arange(0, BLOCK_R)
    r_valid = r < RANK
    h = tl.load(h_ptr + token * RANK + r, mask=r_valid, other=0.0)
    b = tl.load(
        lora_b_ptr + (tl.maximum(slot, 0) * RANK + r[None, :]) * out_features + n[:, None],
        mask=n_valid[:, None] & r_valid[None, :],
        other=0.0,
    )
    update = tl.sum(b.to(tl.float32) * h[None, :], axis=1)
    y_row = y_ptr + token * stride_y_token + n
    y = tl.load(y_row, mask=n_valid, other=0.0)
    tl.store(y_row, (y.to(tl.float32) + update).to(y_ptr.dtype.element_ty), mask=n_valid)


def add_lora(
    y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slots: torch.Tensor
) -> None:
    """y [T, out] += per token t with slots[t] >= 0: lora_b[s].T @ (lora_a[s] @ x[t]), s = slots[t]. x [T, in]
    of y's dtype, rows of both contiguous; lora_a [S, R, in], lora_b [S, R, out] contiguous (float32 or y's
    dtype), R <= 128; slots [T] int32 or int64 on y's device, each in [-1, S) (not checked: no host sync)."""
    num_tokens, out_features = y.shape
    rank, in_features = lora_a.shape[1:]
    assert x.shape == (num_tokens, in_features) and lora_b.shape[1:] == (rank, out_features)
    assert y.stride(-1) == x.stride(-1) == 1 and lora_a.is_contiguous() and lora_b.is_contiguous()
    if num_tokens == 0:
        return
    h = torch.empty(num_tokens, rank, dtype=torch.float32, device=y.device)
    block_r = triton.next_power_of_2(rank)
    _lora_shrink_kernel[(num_tokens,)](
        h, x, lora_a, slots, in_features, x.stride(0), RANK=rank, BLOCK_R=block_r, BLOCK_K=BLOCK_IN
    )
    _lora_expand_kernel[(num_tokens, triton.cdiv(out_features, BLOCK_OUT))](
        y, h, lora_b, slots, out_features, y.stride(0), RANK=rank, BLOCK_R=block_r, BLOCK_N=BLOCK_OUT
    )
