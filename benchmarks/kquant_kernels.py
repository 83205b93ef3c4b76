"""K-quant matmuls on CPU at a 1B-class Llama's shapes (hidden 2048, MLP 8192, 49152-token vocabulary):
the packed integer kernel the engine uses with 8-bit activations (`gguf_pack`, kernels/cpu/gguf_kquant_matmul.cpp)
against the exact path on the file's rows (`gguf_matmul` with float activations: the row kernel at batch <= 8,
dequantized tiles and ATen's float32 GEMM above) and the float32 matmul of the dequantized weight, same
inputs; then the packed kernel's scaling from 1 thread to --threads. Weights are random blocks (timing does not
depend on their values). Median microseconds per call.

    python benchmarks/kquant_kernels.py --threads 2 --batch-sizes 1 8 32 128 512

--amx: the packed kernel with its AMX path (kernels/cpu/gguf_kquant_amx.cpp; Q4_0/Q4_1/Q8_0:
gguf_block_amx.cpp) on and off, on 16-bit (the default setting; K-quants' 15-bit blocks) and 8-bit
activations (--bits 32: float32, the exact setting), the LM head left out; GOPS counts a multiply-add as 2.

    python benchmarks/kquant_kernels.py --amx --threads 2 --batch-sizes 64 256
    python benchmarks/kquant_kernels.py --amx --types Q4_0 Q8_0 --bits 16 32 --batch-sizes 16 256
"""

import argparse
import os
import sys
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.gguf_ops import (
    GGML_BLOCK_FORMATS,
    NATIVE_GGML_TYPES,
    gguf_dequantize,
    gguf_matmul,
    gguf_pack,
    gguf_packed_matmul,
    gguf_set_amx,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing, however this file is run
from timing import median_seconds  # noqa: E402

# [N, K]: fused qkv, o, fused gate_up, down, LM head
SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (49152, 2048)]
TYPES = ["Q4_K", "Q5_K", "Q6_K"]


def random_rows(ggml_type: int, n: int, k: int) -> torch.Tensor:
    """Random ggml blocks with small finite fp16 scales (their first four bytes; Q6_K's d is its last two)."""
    weights, nbytes = GGML_BLOCK_FORMATS[ggml_type]
    rng = np.random.default_rng(ggml_type)
    blocks = rng.integers(0, 256, (n * k // weights, nbytes), dtype=np.uint8)
    offsets = (208,) if ggml_type == NATIVE_GGML_TYPES["Q6_K"] else (0, 2)
    for offset in offsets:
        halves = (rng.standard_normal(len(blocks)) * 0.01).astype(np.float16)
        blocks[:, offset : offset + 2] = halves.view(np.uint8).reshape(-1, 2)
    return torch.from_numpy(blocks.reshape(n, -1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--amx", action="store_true", help="the packed kernel with AMX on and off")
    parser.add_argument("--types", nargs="+", default=TYPES, choices=[*TYPES, "Q4_0", "Q4_1", "Q8_0"])
    parser.add_argument(
        "--bits", type=int, nargs="+", default=[16, 8], choices=[8, 16, 32], help="with --amx"
    )
    args = parser.parse_args()
    if args.amx:
        compare_amx(args.types, args.bits, args.threads, args.batch_sizes, args.iterations)
    else:
        compare_paths(args.types, args.threads, args.batch_sizes, args.iterations)


def compare_paths(types: list[str], threads: int, batch_sizes: list[int], iterations: int) -> None:
    print(f"median us per call, {threads} threads")
    print(
        f"{'type':>5s} {'N x K':>12s} {'batch':>5s} {'packed i8':>10s} {'rows f32':>10s} {'float32':>10s} "
        f"{'vs rows':>8s} {'vs f32':>8s} {'1 thread':>9s} {'scaling':>8s}"
    )
    for name in types:
        ggml_type = NATIVE_GGML_TYPES[name]
        for n, k in SHAPES:
            rows = random_rows(ggml_type, n, k)
            packed, weight = gguf_pack(rows, ggml_type), gguf_dequantize(rows, ggml_type, k)
            for batch in batch_sizes:
                x = torch.randn(batch, k)
                calls = {
                    "packed": partial(gguf_packed_matmul, x, packed, ggml_type, n, 8),
                    "rows": partial(gguf_matmul, x, rows, ggml_type, 32),
                    "float32": partial(F.linear, x, weight),
                }
                torch.set_num_threads(threads)
                us = {key: 1e6 * median_seconds(call, iterations) for key, call in calls.items()}
                torch.set_num_threads(1)
                alone = 1e6 * median_seconds(calls["packed"], iterations)
                print(
                    f"{name:>5s} {f'{n} x {k}':>12s} {batch:5d} {us['packed']:10.0f} {us['rows']:10.0f} "
                    f"{us['float32']:10.0f} {us['rows'] / us['packed']:7.2f}x {us['float32'] / us['packed']:7.2f}x "
                    f"{alone:9.0f} {alone / us['packed']:7.2f}x",
                    flush=True,
                )


def compare_amx(
    types: list[str], bit_widths: list[int], threads: int, batch_sizes: list[int], iterations: int
) -> None:
    if not gguf_set_amx(True):
        sys.exit("no AMX-INT8 here (CPU flag amx_int8, a build with it, Linux 5.16+)")
    torch.set_num_threads(threads)
    print(f"median us per call and GOPS, {threads} threads")
    print(
        f"{'type':>5s} {'N x K':>12s} {'bits':>4s} {'batch':>5s} {'AMX us':>8s} {'GOPS':>6s} "
        f"{'VNNI us':>8s} {'GOPS':>6s} {'AMX vs VNNI':>11s}"
    )
    for name in types:
        ggml_type = NATIVE_GGML_TYPES[name]
        for n, k in SHAPES[:-1]:
            packed = gguf_pack(random_rows(ggml_type, n, k), ggml_type)
            for bits in bit_widths:
                for batch in batch_sizes:
                    call = partial(gguf_packed_matmul, torch.randn(batch, k), packed, ggml_type, n, bits)
                    us = []
                    for enabled in (True, False):
                        gguf_set_amx(enabled)
                        us.append(1e6 * median_seconds(call, iterations))
                    gops = [2 * n * k * batch / t / 1e3 for t in us]
                    print(
                        f"{name:>5s} {f'{n} x {k}':>12s} {bits:4d} {batch:5d} {us[0]:8.0f} {gops[0]:6.0f} "
                        f"{us[1]:8.0f} {gops[1]:6.0f} {us[1] / us[0]:10.2f}x",
                        flush=True,
                    )
    gguf_set_amx(True)


if __name__ == "__main__":
    main()
