"""Attention of one layer on CPU: the torch backend (decodes: gather K/V through the block tables into a
padded copy, then SDPA; chunks: SDPA) against the native kernel (K/V read in place, every token one query
up to its own position), on the same batch.

Geometry defaults to SmolLM2-135M's (9 query heads, 3 KV heads, head_dim 64), float32, block size 16,
block tables shuffled like a cache that has been in use. Times are medians per layer call; the
per-step metadata (built once for all layers) is excluded. Decodes: `batch` requests of `context` tokens,
attention alone. With --chunk-lens, also one request's chunk of that many tokens over each cached context
(context 0: a fresh prompt; 1 + k tokens: a speculative verification), through the whole layer forward
(K/V write included).

    python benchmarks/cpu_attention.py --threads 2 --batch-sizes 1 16 64 --contexts 128 512
    python benchmarks/cpu_attention.py --batch-sizes --contexts 0 300 --chunk-lens 5 32 128 512
"""

import argparse
import os
import sys

import torch

from pagedserve.attention.backends.base import (
    AnyAttentionBackend,
    AttentionLayerSpec,
    CommonAttentionMetadata,
)
from pagedserve.attention.backends.cpu_native import CpuNativeAttentionBackend
from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend
from pagedserve.kernels.cpu import load_cpu_kernels, paged_attention
from pagedserve.utils import cdiv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing, however this file is run
from timing import median_seconds  # noqa: E402


def decode_batch(batch: int, context: int, block_size: int) -> tuple[CommonAttentionMetadata, int]:
    """`batch` decodes of `context` tokens each over shuffled blocks; returns it and the cache's blocks."""
    per_request = cdiv(context, block_size)
    num_blocks = batch * per_request + 1  # + the null block
    tables = (torch.randperm(num_blocks - 1)[: batch * per_request] + 1).view(batch, per_request)
    common = CommonAttentionMetadata.from_lists(
        list(range(batch + 1)),
        [context] * batch,
        tables,
        torch.zeros(batch, dtype=torch.int64),
        batch,
        block_size,
    )
    return common, num_blocks


def decode_ms(
    native: bool, spec: AttentionLayerSpec, batch: int, context: int, args: argparse.Namespace
) -> float:
    """The attention of `batch` decodes: the native kernel's, or the torch backend's gather and SDPA."""
    common, num_blocks = decode_batch(batch, context, args.block_size)
    shape = (num_blocks, args.block_size, spec.num_kv_heads, spec.head_dim)
    key_cache, value_cache = torch.randn(shape), torch.randn(shape)
    q = torch.randn(batch, spec.num_heads, spec.head_dim)
    if native:  # the step's tensors made once, as the backend's metadata holds them for every layer
        lens, starts = torch.tensor(common.seq_lens), torch.tensor(common.query_start_loc)
        tables = common.block_tables
        return 1e3 * median_seconds(
            lambda: paged_attention(
                q, key_cache, value_cache, tables, lens, spec.scale, query_start_loc=starts
            ),
            args.iterations,
        )
    backend = TorchPagedAttentionBackend()
    decode = backend.build_decode_metadata(common, common.num_decodes)
    return 1e3 * median_seconds(
        lambda: backend.attend_decodes(spec, q, key_cache, value_cache, decode), args.iterations
    )


def chunk_ms(backend: AnyAttentionBackend, spec: AttentionLayerSpec, context: int, chunk: int, args) -> float:
    """One layer's forward for one request's `chunk` new tokens over `context` cached ones."""
    per_request = cdiv(context + chunk, args.block_size)
    tables = (torch.randperm(per_request) + 1).view(1, per_request)
    positions = torch.arange(context, context + chunk)
    slots = tables[0, positions // args.block_size] * args.block_size + positions % args.block_size
    common = CommonAttentionMetadata.from_lists(
        [0, chunk], [context + chunk], tables, slots, 0, args.block_size
    )
    shape = (per_request + 1, args.block_size, spec.num_kv_heads, spec.head_dim)
    cache = (torch.randn(shape), torch.randn(shape))
    q = torch.randn(chunk, spec.num_heads * spec.head_dim)
    k, v = (torch.randn(chunk, spec.num_kv_heads * spec.head_dim) for _ in range(2))
    metadata = backend.build_metadata(common)
    return 1e3 * median_seconds(lambda: backend.forward(spec, q, k, v, cache, metadata), args.iterations)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument("--chunk-lens", type=int, nargs="*", default=[])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--num-heads", type=int, default=9)
    parser.add_argument("--num-kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    kernels = load_cpu_kernels()
    if kernels.module is None:
        raise SystemExit(f"The native CPU kernels are unavailable: {kernels.error}")
    spec = AttentionLayerSpec(args.num_heads, args.num_kv_heads, args.head_dim, args.head_dim**-0.5)
    print(
        f"Attention per layer, float32, {args.threads} threads, heads {args.num_heads}/"
        f"{args.num_kv_heads} kv, head_dim {args.head_dim}, block size {args.block_size}; "
        f"torch {torch.__version__}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    )
    if args.batch_sizes:
        print("| batch | context | K/V read MB | torch gather+SDPA ms | native kernel ms | speed-up |")
        print("|---|---|---|---|---|---|")
    for batch in args.batch_sizes:
        for context in args.contexts:
            torch_ms = decode_ms(False, spec, batch, context, args)
            native_ms = decode_ms(True, spec, batch, context, args)
            megabytes = 2 * batch * context * args.num_kv_heads * args.head_dim * 4 / 1e6
            print(
                f"| {batch} | {context} | {megabytes:.1f} | {torch_ms:.3f} | {native_ms:.3f} | "
                f"{torch_ms / native_ms:.1f}x |"
            )
    if args.chunk_lens:
        print("\n| chunk | context | torch SDPA chunk ms | native kernel ms | speed-up |")
        print("|---|---|---|---|---|")
    for chunk in args.chunk_lens:
        for context in args.contexts:
            torch_ms = chunk_ms(TorchPagedAttentionBackend(), spec, context, chunk, args)
            native_ms = chunk_ms(CpuNativeAttentionBackend(), spec, context, chunk, args)
            print(f"| {chunk} | {context} | {torch_ms:.3f} | {native_ms:.3f} | {torch_ms / native_ms:.1f}x |")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
