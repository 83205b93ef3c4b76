"""fp8 weight-only matmul on CPU, SmolLM2-135M's shapes: our native kernel (fp8 weights, 1 byte each,
per-channel scales; float32 activations) against torch's float32 `F.linear` (4 bytes per weight) and
bfloat16 `F.linear` (2 bytes, bfloat16 activations), same inputs. Median microseconds per call and the
speed-up over float32.

    python benchmarks/fp8_matmul.py --threads 2 --batch-sizes 1 8 64
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.fp8_ops import fp8_matmul, fp8_matmul_isa
from pagedserve.quantization.fp8 import FP8_MAX

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing, however this file is run
from timing import median_seconds  # noqa: E402

# [N, K] (outputs, inputs): q and o, k and v, gate and up, down, the LM head
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]


def contenders(weight: torch.Tensor) -> dict:
    scale = weight.abs().amax(dim=1, keepdim=True) / FP8_MAX
    bits = (weight / scale).to(torch.float8_e4m3fn).view(torch.uint8)
    bf16 = weight.bfloat16()
    return {
        "float32": lambda x: F.linear(x, weight),
        "bf16": lambda x: F.linear(x.bfloat16(), bf16),
        "fp8 ours": lambda x: fp8_matmul(x, bits, scale, weight.shape[1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"threads={args.threads}, fp8 kernel vector code: {fp8_matmul_isa()}; median us per call")
    header = f"{'N x K':>12} {'batch':>5} {'float32':>9} {'bf16':>9} {'fp8 ours':>9} {'fp8 vs f32':>10}"
    print(header)
    print("-" * len(header))
    for n, k in SHAPES:
        weight = torch.randn(n, k) * 0.05
        calls = contenders(weight)
        for batch in args.batch_sizes:
            x = torch.randn(batch, k)
            times = {
                name: median_seconds(lambda f=f, x=x: f(x), args.iterations) * 1e6
                for name, f in calls.items()
            }
            print(
                f"{f'{n} x {k}':>12} {batch:>5} {times['float32']:>9.1f} {times['bf16']:>9.1f} "
                f"{times['fp8 ours']:>9.1f} {times['float32'] / times['fp8 ours']:>9.2f}x"
            )


if __name__ == "__main__":
    main()
