"""The torch backend (the reference every backend is tested against), against plain causal attention over
each request's whole sequence: decodes, prompt chunks with and without a cached prefix, GQA and MHA."""

import random

import pytest
import torch
import torch.nn.functional as F

from pagedserve.attention.backends import get_attention_backend
from pagedserve.attention.backends.base import AttentionLayerSpec, CommonAttentionMetadata
from pagedserve.utils import cdiv

NUM_BLOCKS = 48


def dense_reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, num_cached: int, spec: AttentionLayerSpec
) -> torch.Tensor:
    """q [new, heads, dim] at positions num_cached.. attends causally to keys/values [seq, kv_heads, dim]."""
    group = spec.num_heads // spec.num_kv_heads
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, keys) * spec.scale
    positions = torch.arange(q.shape[0])[:, None] + num_cached
    scores = scores.masked_fill(torch.arange(keys.shape[0])[None, :] > positions, float("-inf"))
    return torch.einsum("hqk,khd->qhd", F.softmax(scores, dim=-1), values)


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 4)], ids=["gqa", "mha"])
def test_torch_backend_equals_dense_causal_attention(
    block_size: int, num_heads: int, num_kv_heads: int
) -> None:
    torch.manual_seed(block_size * num_kv_heads)
    rng = random.Random(block_size)
    spec = AttentionLayerSpec(num_heads, num_kv_heads, 32, scale=32**-0.5)
    # (cached tokens, new tokens): decodes first (one new token), then a fresh prompt and prompt chunks
    # after a cached prefix (mid-block and at a block boundary).
    requests = [
        (0, 1),
        (block_size, 1),
        (2 * block_size + 3, 1),
        (0, 11),
        (block_size + 5, 7),
        (block_size, 9),
    ]
    sequences = [
        (torch.randn(c + n, num_kv_heads, 32), torch.randn(c + n, num_kv_heads, 32)) for c, n in requests
    ]
    pool = list(range(1, NUM_BLOCKS))
    rng.shuffle(pool)
    key_cache = torch.zeros(NUM_BLOCKS, block_size, num_kv_heads, 32)
    value_cache = torch.zeros_like(key_cache)
    tables = torch.zeros(len(requests), max(cdiv(c + n, block_size) for c, n in requests), dtype=torch.int64)
    query_start_loc, slots, new_k, new_v = [0], [], [], []
    for row, ((cached, new), (keys, values)) in enumerate(zip(requests, sequences)):
        tables[row, : cdiv(cached + new, block_size)] = torch.tensor(
            [pool.pop() for _ in range(cdiv(cached + new, block_size))]
        )
        for position in range(cached + new):
            block, offset = int(tables[row, position // block_size]), position % block_size
            if position < cached:  # the prefix is in the cache already; the new tokens are written now
                key_cache[block, offset], value_cache[block, offset] = keys[position], values[position]
            else:
                slots.append(block * block_size + offset)
        new_k.append(keys[cached:])
        new_v.append(values[cached:])
        query_start_loc.append(query_start_loc[-1] + new)
    common = CommonAttentionMetadata.from_lists(
        query_start_loc,
        [c + n for c, n in requests],
        tables,
        torch.tensor(slots),
        num_decodes=3,
        block_size=block_size,
    )
    q = torch.randn(query_start_loc[-1], num_heads * 32)
    backend = get_attention_backend("torch")
    out = backend.forward(
        spec,
        q,
        torch.cat(new_k).flatten(1),
        torch.cat(new_v).flatten(1),
        (key_cache, value_cache),
        backend.build_metadata(common),
    )

    assert out.shape == q.shape
    for row, ((cached, new), (keys, values)) in enumerate(zip(requests, sequences)):
        rows = slice(query_start_loc[row], query_start_loc[row + 1])
        expected = dense_reference(q[rows].view(new, num_heads, 32), keys, values, cached, spec)
        torch.testing.assert_close(out[rows].view(new, num_heads, 32), expected, atol=1e-5, rtol=1e-5)
        # The new K/V went to their slots.
        block = int(tables[row, (cached + new - 1) // block_size])
        assert torch.equal(key_cache[block, (cached + new - 1) % block_size], keys[-1])
