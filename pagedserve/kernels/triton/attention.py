"""Paged attention over block tables for a mixed batch: prefill chunks (varlen, causal over the cached
prefix as well: prefix-cache hits and chunked prefill) and decodes, in one kernel.

A program attends one *query tile* (up to BLOCK_Q consecutive query tokens of one request, times the
NUM_QUERIES_PER_KV query heads sharing one KV head: GQA/MQA read each K/V tile once for the whole group)
over one *split* of the keys. Keys are gathered TILE_N at a time through the block table, so any block
size works. With NUM_SPLITS > 1 (decodes over long contexts, few programs) each split writes a partial
result and its log-sum-exp, and `_combine_splits_kernel` merges them (split-K / flash-decoding).
"""

from dataclasses import dataclass, field

import numpy as np
import torch
import triton
import triton.language as tl

from pagedserve.utils import cdiv

TILE_N = 32  # keys per iteration; a multiple of every supported block size (8/16/32)
MIN_DOT = 16  # tl.dot needs at least 16 rows and a reduction of at least 16 on GPUs
MAX_SPLITS = 16
MIN_KEYS_PER_SPLIT = 512
TARGET_PROGRAMS = 128  # about one wave of programs on a large GPU (132 SMs on an H100/H200)
LOG2E_CONST = tl.constexpr(1.4426950408889634)  # the softmax runs in exp2: scores are scaled by log2(e)


# NOTE: untyped: triton ships no types, and @triton.jit compiles this source (tl.constexpr marks only).
@triton.jit  # type: ignore[untyped-decorator]
def _paged_attention_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    q_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    tile_request_ptr,
    tile_q_start_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    sinks_ptr,
    scale,
    softcap,
    k_scale,
    v_scale,
    sliding_window,
    num_heads,
    stride_q_token,
    stride_q_head,
    stride_o_token,
    stride_o_head,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_bt_row,
    NUM_QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DECODE_ONLY: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_SINKS: tl.constexpr,
    KV_FP8: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile_id = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if DECODE_ONLY:  # one tile per request, its single query token
        request = tile_id
        q_tile_start = 0
    else:
        request = tl.load(tile_request_ptr + tile_id)
        q_tile_start = tl.load(tile_q_start_ptr + tile_id)
    q_begin = tl.load(query_start_loc_ptr + request)
    q_len = tl.load(query_start_loc_ptr + request + 1) - q_begin
    seq_len = tl.load(seq_lens_ptr + request)
    context_len = seq_len - q_len  # keys already cached before this step's query tokens

    # Row m of the tile: query token q_tile_start + m // G, query head kv_head * G + m % G.
    m = tl.arange(0, BLOCK_M)
    row_token = q_tile_start + m // NUM_QUERIES_PER_KV
    head = kv_head * NUM_QUERIES_PER_KV + m % NUM_QUERIES_PER_KV
    row_valid = (m // NUM_QUERIES_PER_KV < BLOCK_Q) & (row_token < q_len)
    d = tl.arange(0, BLOCK_D)
    d_valid = d < HEAD_DIM
    token_index = (q_begin + row_token).to(tl.int64)
    q = tl.load(
        q_ptr + token_index[:, None] * stride_q_token + head[:, None] * stride_q_head + d[None, :],
        mask=row_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    q_pos = context_len + row_token  # absolute position of each row's token

    # The keys this tile needs: up to its last row's own position (causal), from its first row's
    # window start when a sliding window applies; then this split's share of them.
    key_end = context_len + tl.minimum(q_tile_start + BLOCK_Q, q_len)
    key_begin = 0
    if USE_WINDOW:
        key_begin = tl.maximum(context_len + q_tile_start - sliding_window + 1, 0)
    first_tile = key_begin // TILE
    num_tiles = tl.cdiv(key_end, TILE)
    per_split = tl.cdiv(num_tiles - first_tile, NUM_SPLITS)
    tile_lo = first_tile + split * per_split
    tile_hi = tl.minimum(tile_lo + per_split, num_tiles)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if USE_SINKS:  # the sink starts the running softmax as one logit with no value, in split 0 alone
        sink = tl.load(sinks_ptr + head, mask=row_valid, other=0.0).to(tl.float32) * LOG2E_CONST
        m_i = tl.where(split == 0, sink, m_i)
        l_i = tl.where(split == 0, 1.0, l_i)
    block_table_row = block_tables_ptr + request.to(tl.int64) * stride_bt_row
    for t in range(tile_lo, tile_hi):
        n = t * TILE + tl.arange(0, TILE)
        n_valid = n < key_end
        block = tl.load(block_table_row + n // BLOCK_SIZE, mask=n_valid, other=0).to(tl.int64)
        slot = block * stride_cache_block + (n % BLOCK_SIZE) * stride_cache_slot + kv_head * stride_cache_head
        kv_mask = n_valid[None, :] & d_valid[:, None]
        k = tl.load(key_cache_ptr + slot[None, :] + d[:, None], mask=kv_mask, other=0.0)  # [D, TILE]
        v = tl.load(value_cache_ptr + slot[:, None] + d[None, :], mask=tl.trans(kv_mask), other=0.0)
        if KV_FP8:  # fp8 KV cache hook: the cache holds value / scale
            k = (k.to(tl.float32) * k_scale).to(q.dtype)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale  # [BLOCK_M, TILE]
        if USE_SOFTCAP:  # Gemma 2: softcap * tanh(s / softcap), tanh(x) = 2 sigmoid(2x) - 1
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)
        s = s * LOG2E_CONST  # exp2 below
        allowed = n_valid[None, :] & (n[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            allowed = allowed & (n[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: avoid -inf - -inf
        p = tl.exp2(s - m_ref[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    has_keys = l_i > 0.0
    result = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    store_mask = row_valid[:, None] & d_valid[None, :]
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + token_index[:, None] * stride_o_token + head[:, None] * stride_o_head + d[None, :],
            result.to(out_ptr.dtype.element_ty),
            mask=store_mask,
        )
    else:
        partial = (token_index * num_heads + head) * NUM_SPLITS + split
        tl.store(partial_out_ptr + partial[:, None] * HEAD_DIM + d[None, :], result, mask=store_mask)
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(partial_lse_ptr + partial, lse, mask=row_valid)


# NOTE: untyped: triton ships no types, and @triton.jit compiles this source (tl.constexpr marks only).
@triton.jit  # type: ignore[untyped-decorator]
def _combine_splits_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    num_heads,
    stride_o_token,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_POW2: tl.constexpr,
):
    """One program per (token, head): the splits' partial outputs weighted by their share of the softmax."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_POW2)
    d = tl.arange(0, BLOCK_D)
    base = (token * num_heads + head) * NUM_SPLITS
    lse = tl.load(partial_lse_ptr + base + s, mask=s < NUM_SPLITS, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    weight = tl.exp2(lse - tl.where(lse_max == float("-inf"), 0.0, lse_max))  # empty splits weigh 0
    parts = tl.load(
        partial_out_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :],
        mask=(s < NUM_SPLITS)[:, None] & (d < HEAD_DIM)[None, :],
        other=0.0,
    )
    out = tl.sum(parts * weight[:, None], axis=0) / tl.maximum(tl.sum(weight, axis=0), 1e-30)
    tl.store(
        out_ptr + token * stride_o_token + head * stride_o_head + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d < HEAD_DIM,
    )


@dataclass
class PagedBatch:
    """The step's requests as the kernel reads them, all on the device. Request i owns query tokens
    [query_start_loc[i], query_start_loc[i + 1]) and has seq_lens[i] keys after this step."""

    query_start_loc: torch.Tensor  # [R + 1] int32 or int64
    seq_lens: torch.Tensor  # [R] int32 or int64
    block_tables: torch.Tensor  # [R, max_blocks]
    block_size: int
    num_splits: int  # key splits per query tile (1: no split-K)
    decode_only: bool  # every request has one query token: one tile per request, no tile table
    query_start_loc_host: list[int] | None = None  # for the tile tables of mixed batches
    _tiles: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    def tiles(self, block_q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(request, first query token) of every query tile of `block_q` tokens; built once per step and
        tile size, shared by every layer."""
        if block_q not in self._tiles:
            assert self.query_start_loc_host is not None, "mixed batches carry their query_start_loc"
            self._tiles[block_q] = query_tiles(self.query_start_loc_host, block_q, self.seq_lens.device)
        return self._tiles[block_q]


def query_tiles(
    query_start_loc: list[int], block_q: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    starts = np.asarray(query_start_loc, dtype=np.int64)
    num_tiles = -(-np.diff(starts) // block_q)  # NOTE: cdiv, elementwise over a numpy array
    request = np.repeat(np.arange(len(num_tiles)), num_tiles)
    first_tile = np.repeat(np.cumsum(num_tiles) - num_tiles, num_tiles)
    q_start = (np.arange(len(request)) - first_tile) * block_q
    return (
        torch.from_numpy(request.astype(np.int32)).to(device),
        torch.from_numpy(q_start.astype(np.int32)).to(device),
    )


def choose_num_splits(num_requests: int, max_seq_len: int, decode_only: bool) -> int:
    """Split-K only pays when a decode batch has too few programs to fill the GPU and long contexts."""
    if not decode_only:
        return 1
    by_length = cdiv(max_seq_len, MIN_KEYS_PER_SPLIT)
    by_occupancy = cdiv(TARGET_PROGRAMS, max(num_requests, 1))
    return max(1, min(MAX_SPLITS, by_length, by_occupancy))


def prefill_block_q(num_queries_per_kv: int) -> int:
    """Query tokens per tile so that a tile has about 64 rows (tokens x query heads of one KV head)."""
    padded_heads: int = triton.next_power_of_2(num_queries_per_kv)
    return max(1, 64 // padded_heads)


def paged_attention(
    out: torch.Tensor,
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    batch: PagedBatch,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sinks: torch.Tensor | None = None,
) -> None:
    """out, q [T, num_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads, head_dim] (K/V of
    this step already written). Fills `out`. sliding_window: each token attends to itself and the
    window - 1 keys before it. logits_soft_cap c: scores s become c * tanh(s / c). sinks [num_heads]:
    head h's softmax denominator gains e^sinks[h] (gpt-oss). An fp8 cache holds K / k_scale and
    V / v_scale."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    assert group * num_kv_heads == num_heads and key_cache.shape[1] == batch.block_size
    assert key_cache.stride() == value_cache.stride() and key_cache.stride(-1) == q.stride(-1) == 1
    if num_tokens == 0:
        return
    if batch.decode_only:
        block_q, tile_request, tile_q_start = 1, batch.seq_lens, batch.seq_lens  # tile tables unused
        num_tiles = batch.seq_lens.shape[0]
    else:
        block_q = prefill_block_q(group)
        tile_request, tile_q_start = batch.tiles(block_q)
        num_tiles = tile_request.shape[0]
    splits = batch.num_splits
    partial_out = partial_lse = out  # unused unless split
    if splits > 1:
        partial_out = torch.empty(
            num_tokens, num_heads, splits, head_dim, dtype=torch.float32, device=q.device
        )
        partial_lse = torch.empty(num_tokens, num_heads, splits, dtype=torch.float32, device=q.device)
    block_d = max(MIN_DOT, triton.next_power_of_2(head_dim))
    _paged_attention_kernel[(num_tiles, num_kv_heads, splits)](
        out,
        q,
        key_cache,
        value_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        tile_request,
        tile_q_start,
        partial_out,
        partial_lse,
        out if sinks is None else sinks,  # unread without sinks
        scale,
        logits_soft_cap or 1.0,
        k_scale,
        v_scale,
        sliding_window or 0,
        num_heads,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        batch.block_tables.stride(0),
        NUM_QUERIES_PER_KV=group,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_SIZE=batch.block_size,
        BLOCK_Q=block_q,
        BLOCK_M=max(MIN_DOT, triton.next_power_of_2(block_q * group)),
        TILE=TILE_N,
        NUM_SPLITS=splits,
        DECODE_ONLY=batch.decode_only,
        USE_WINDOW=sliding_window is not None,
        USE_SOFTCAP=logits_soft_cap is not None,
        USE_SINKS=sinks is not None,
        KV_FP8=key_cache.dtype.itemsize == 1,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    if splits > 1:
        _combine_splits_kernel[(num_tokens, num_heads)](
            out,
            partial_out,
            partial_lse,
            num_heads,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            NUM_SPLITS=splits,
            SPLITS_POW2=triton.next_power_of_2(splits),
        )
