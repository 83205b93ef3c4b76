"""GPTQ/AWQ linear layers on CPU, SmolLM2-135M's shapes, groups of 64: our layer (Q4_0 blocks; asymmetric:
+ a float32 offset per group; act-order: + the activation gather) against the float32 matmul, our Q4_1
kernel (the other layout the groups could be repacked into) and torch's `_weight_int4pack_mm_for_cpu` (which
takes GPTQ's scale/zero form directly; float32 and bfloat16 activations). Median microseconds per call.

    python benchmarks/int4_checkpoint_kernels.py --threads 1 --batch-sizes 1 8 64
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

from pagedserve.config.int4_checkpoint import Int4CheckpointFormat
from pagedserve.kernels.cpu.gguf_ops import gguf_matmul
from pagedserve.layers.linear import ColumnParallelLinear
from pagedserve.quantization.base import set_quantization_config
from pagedserve.quantization.gptq import GPTQConfig
from pagedserve.quantization.rtn import GGML_Q4_1, quantize_q4_1

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing, however this file is run
from timing import median_seconds  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # [N, K]: qkv, o, gate_up, down
GROUP = 64


def our_layer(n: int, k: int, symmetric: bool, act_order: bool) -> ColumnParallelLinear:
    """A GPTQ layer with random 4-bit weights, staged as the checkpoint loader stages them."""
    with set_quantization_config(GPTQConfig(Int4CheckpointFormat("gptq", GROUP, act_order, False))):
        layer = ColumnParallelLinear(k, n)
    method = layer.quant_method
    method.pairs.copy_(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8))
    method.zeros.copy_(
        torch.full_like(method.zeros, 8) if symmetric else torch.randint_like(method.zeros, 16)
    )
    method.scales.copy_(torch.rand(n, k // GROUP) * 0.01)
    if act_order:
        method.group_index = torch.empty(k, dtype=torch.int64)
        method.group_index[torch.randperm(k)] = torch.arange(k) // GROUP
    method.process_weights_after_loading(layer)
    return layer


def torch_int4(weight: torch.Tensor, activation_dtype: torch.dtype):
    n, k = weight.shape
    q = torch.randint(0, 16, (n, k), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_and_zeros = torch.rand(k // GROUP, n, 2).to(activation_dtype)
    return lambda x: torch._weight_int4pack_mm_for_cpu(
        x.to(activation_dtype), packed, GROUP, scales_and_zeros
    )


def kernels(n: int, k: int) -> dict:
    weight = torch.randn(n, k) * 0.02
    q4_1 = quantize_q4_1(weight)
    layers = {
        "sym": our_layer(n, k, True, False),
        "asym": our_layer(n, k, False, False),
        "asym+actorder": our_layer(n, k, False, True),
    }
    return {
        "float32": lambda x: F.linear(x, weight),
        **{f"ours {name}": layer for name, layer in layers.items()},
        "Q4_1": lambda x: gguf_matmul(x, q4_1, GGML_Q4_1),
        "torch int4 f32": torch_int4(weight, torch.float32),
        "torch int4 bf16": torch_int4(weight, torch.bfloat16),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    header = None
    for n, k in SHAPES:
        calls = kernels(n, k)
        if header is None:
            header = f"{'N x K':>12s} {'batch':>5s} " + " ".join(f"{name:>17s}" for name in calls)
            print(f"median us per call, {args.threads} threads, groups of {GROUP}\n{header}")
        for batch in args.batch_sizes:
            x = torch.randn(batch, k)
            with torch.no_grad():
                times = [
                    1e6 * median_seconds(lambda call=call, x=x: call(x), args.iterations)
                    for call in calls.values()
                ]
            print(f"{f'{n} x {k}':>12s} {batch:5d} " + " ".join(f"{t:17.0f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
