"""Random paged batches and caches shared by the attention kernel tests."""

import random

import torch

from pagedserve.attention.backends.base import (
    AnyAttentionBackend,
    AttentionLayerSpec,
    CommonAttentionMetadata,
)
from pagedserve.attention.backends.cpu_native import CpuNativeAttentionBackend
from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend
from pagedserve.utils import cdiv

NUM_BLOCKS = 64


def make_batch(
    requests: list[tuple[int, int]], block_size: int, seed: int, num_blocks: int = NUM_BLOCKS
) -> CommonAttentionMetadata:
    """(cached tokens, new tokens) per request, decodes (1 new token) first. Blocks are drawn from a
    shuffled pool, so tables are non-contiguous; rows are padded with the null block 0."""
    rng = random.Random(seed)
    pool = list(range(1, num_blocks))
    rng.shuffle(pool)
    max_blocks = max(cdiv(c + n, block_size) for c, n in requests) + 1  # + a padding column
    tables = torch.zeros(len(requests), max_blocks, dtype=torch.int64)
    query_start_loc, seq_lens, slots = [0], [], []
    for row, (cached, new) in enumerate(requests):
        num = cdiv(cached + new, block_size)
        tables[row, :num] = torch.tensor([pool.pop() for _ in range(num)])
        slots += [
            int(tables[row, p // block_size]) * block_size + p % block_size
            for p in range(cached, cached + new)
        ]
        query_start_loc.append(query_start_loc[-1] + new)
        seq_lens.append(cached + new)
    return CommonAttentionMetadata.from_lists(
        query_start_loc,
        seq_lens,
        tables,
        torch.tensor(slots),
        num_decodes=sum(1 for _, n in requests if n == 1),
        block_size=block_size,
    )


def random_cache(
    block_size: int, spec: AttentionLayerSpec, dtype: torch.dtype, num_blocks: int = NUM_BLOCKS
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    return torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)


def forward_on_both_backends(
    spec: AttentionLayerSpec,
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    caches: tuple[torch.Tensor, torch.Tensor],
    common: CommonAttentionMetadata,
) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """One step of (q, k, v) through the torch and the cpu backend, each on its own copy of `caches`:
    ([torch output, cpu output], [torch's caches after, cpu's caches after])."""
    outputs, written = [], []
    backends: list[AnyAttentionBackend] = [TorchPagedAttentionBackend(), CpuNativeAttentionBackend()]
    for backend in backends:
        cache = (caches[0].clone(), caches[1].clone())
        outputs.append(backend.forward(spec, *qkv, cache, backend.build_metadata(common)))
        written.append(cache)
    return outputs, written
