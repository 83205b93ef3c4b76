"""The Triton matmuls on ggml rows (kernels/triton/quant_matmul.py) on CUDA at a Llama-3-8B MLP layer's
shape (x [B, 4096] times W^T, W [14336, 4096]): `ggml_matmul` per type against torch's bf16 F.linear on the
dequantized weight, bf16 activations, batch 1 (the GEMV) and 256 (tl.dot tiles). Weights are random blocks
(timing does not depend on their values). Median microseconds per call (triton.testing.do_bench) and GB/s of
the weight bytes each reads: the packed rows for ours, the bf16 matrix for F.linear. GPU only.

    python benchmarks/quant_kernels_triton.py --batch-sizes 1 256
"""

import argparse
import os
import sys
from functools import partial

import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.gguf_ops import NATIVE_GGML_TYPES
from pagedserve.quantization.ggml_torch import dequantize_ggml_rows

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # kquant_kernels, however this file is run
from kquant_kernels import random_rows  # noqa: E402

OUT_FEATURES, IN_FEATURES = 14336, 4096
TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--types", nargs="+", choices=TYPES, default=TYPES)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("quant_kernels_triton.py times CUDA kernels and found no CUDA GPU; run it on a GPU machine.")
    from triton.testing import do_bench

    from pagedserve.kernels.triton import ggml_matmul

    print(f"W [{OUT_FEATURES}, {IN_FEATURES}], bf16 activations, {torch.cuda.get_device_name()}")
    print("| type | batch | ggml_matmul us | GB/s | F.linear bf16 us | GB/s | ours / F.linear |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.types:
        ggml_type = NATIVE_GGML_TYPES[name]
        rows = random_rows(ggml_type, OUT_FEATURES, IN_FEATURES).cuda()
        weight = dequantize_ggml_rows(rows, ggml_type, IN_FEATURES).to(torch.bfloat16)
        for batch in args.batch_sizes:
            x = torch.randn(batch, IN_FEATURES, dtype=torch.bfloat16, device="cuda")
            ours = (
                do_bench(partial(ggml_matmul, x, rows, ggml_type, OUT_FEATURES), return_mode="median") / 1e3
            )
            dense = do_bench(partial(F.linear, x, weight), return_mode="median") / 1e3  # ms -> s
            print(
                f"| {name} | {batch} | {ours * 1e6:.1f} | {rows.numel() / ours / 1e9:.0f} | "
                f"{dense * 1e6:.1f} | {weight.numel() * 2 / dense / 1e9:.0f} | {ours / dense:.2f}x |"
            )


if __name__ == "__main__":
    main()
