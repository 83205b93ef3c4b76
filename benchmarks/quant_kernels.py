"""Quantized matmul kernels on CPU, SmolLM2-135M's shapes: our GGUF kernels (Q4_1, Q8_0) on the file's
rows and on the 16-row packed layout the engine uses (`gguf_pack`), with float32 activations ("f32"),
16-bit ("i16", the default) and 8-bit ("i8", llama.cpp's) integer activations (on the rows at batch <= 8,
larger batches in float32 whatever the setting; packed at every batch) against torch's own
int8/int4 kernels and the float32 matmul, same inputs.

torch's: `_weight_int8pack_mm` (int8, one scale per output channel), `_weight_int4pack_mm_for_cpu` (int4,
groups of 32, scales and zeros; float32 and bfloat16 activations). fp8 weights (per-channel scales): our
kernel (weights widened in vector registers) against torch's upcast of the weight then the float32 matmul.
Median microseconds per call.

    python benchmarks/quant_kernels.py --threads 2 --batch-sizes 1 8 64 256
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.fp8_ops import fp8_matmul
from pagedserve.kernels.cpu.gguf_ops import gguf_matmul, gguf_pack, gguf_packed_matmul
from pagedserve.quantization.fp8 import FP8_MAX
from pagedserve.quantization.rtn import GGML_Q4_1, GGML_Q8_0, quantize_q4_1, quantize_q8_0

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing, however this file is run
from timing import median_seconds  # noqa: E402

# [N, K]: fused qkv, o, fused gate_up, down, LM head
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]


def torch_int4(weight: torch.Tensor, activation_dtype: torch.dtype):
    """torch's int4 kernel on `weight` (groups of 32, asymmetric), as a callable of x."""
    n, k = weight.shape
    groups = weight.reshape(n, k // 32, 32)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scale = ((high - low) / 15).clamp_min(1e-8)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    # torch dequantizes as (q - 8) * scale + zero
    scales_and_zeros = torch.stack([scale, low + 8 * scale], dim=2).transpose(0, 1).contiguous()
    scales_and_zeros = scales_and_zeros.to(activation_dtype)
    return lambda x: torch._weight_int4pack_mm_for_cpu(x.to(activation_dtype), packed, 32, scales_and_zeros)


def kernels(weight: torch.Tensor) -> dict:
    scale = weight.abs().amax(dim=1) / 127
    int8 = torch.round(weight / scale[:, None]).to(torch.int8)
    q4_1, q8_0 = quantize_q4_1(weight), quantize_q8_0(weight)
    fp8_scale = weight.abs().amax(dim=1, keepdim=True) / FP8_MAX
    fp8 = (weight / fp8_scale).to(torch.float8_e4m3fn)
    formats = (("Q4_1", q4_1, GGML_Q4_1), ("Q8_0", q8_0, GGML_Q8_0))
    ours = {
        f"{name} {label}": lambda x, rows=rows, ggml_type=ggml_type, bits=bits: gguf_matmul(
            x, rows, ggml_type, bits
        )
        for name, rows, ggml_type in formats
        for label, bits in (("f32", 32), ("i16", 16), ("i8", 8))
    }
    packed_rows = {ggml_type: gguf_pack(rows, ggml_type) for _, rows, ggml_type in formats}
    packed = {
        f"{name} packed {label}": lambda x, ggml_type=ggml_type, bits=bits: gguf_packed_matmul(
            x, packed_rows[ggml_type], ggml_type, weight.shape[0], bits
        )
        for name, _, ggml_type in formats
        for label, bits in (("f32", 32), ("i16", 16), ("i8", 8))
    }
    return {
        "float32": lambda x: F.linear(x, weight),
        **ours,
        **packed,
        "torch int8/ch": lambda x: torch._weight_int8pack_mm(x, int8, scale),
        "torch int4 f32": torch_int4(weight, torch.float32),
        "torch int4 bf16": torch_int4(weight, torch.bfloat16),
        "ours fp8": lambda x: fp8_matmul(x, fp8.view(torch.uint8), fp8_scale, weight.shape[1]),
        "torch fp8 upcast": lambda x: F.linear(x, fp8.float() * fp8_scale),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    header = None
    for n, k in SHAPES:
        calls = kernels(torch.randn(n, k) * 0.02)
        if header is None:
            header = f"{'N x K':>12s} {'batch':>5s} " + " ".join(f"{name:>15s}" for name in calls)
            print(f"median us per call, {args.threads} threads\n{header}")
        for batch in args.batch_sizes:
            x = torch.randn(batch, k)
            times = [
                1e6 * median_seconds(lambda call=call, x=x: call(x), args.iterations)
                for call in calls.values()
            ]
            print(f"{f'{n} x {k}':>12s} {batch:5d} " + " ".join(f"{t:15.0f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
