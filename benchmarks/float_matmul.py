"""The row-invariant float matmul on CPU (kernels/cpu/float_matmul.cpp) against torch's F.linear (oneDNN),
float32 weights and activations, same inputs, on SmolLM2-135M's and a 1B Llama's shapes: median
microseconds per call, ours over oneDNN's, and whether oneDNN gave row 0 the bits it gives it alone
("inv": yes/no; ours always does, which the tests check). `--weights bfloat16` runs ours on bfloat16
weights (widened as read) against F.linear in bfloat16 (bfloat16 activations, AMX/AVX512-BF16 where the
CPU has them).

    python benchmarks/float_matmul.py --threads 2 --batch-sizes 1 8 32 256 512
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.float_ops import float_matmul

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing, however this file is run
from timing import median_seconds  # noqa: E402

# model -> [N, K] (outputs, inputs): fused qkv, o, fused gate_up, down, the LM head
SHAPES = {
    "smollm2-135m": [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)],
    "llama-1b": [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)],
}
LM_HEAD_MAX_BATCH = 32  # the head sees the rows that are sampled: one per decoding request


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 256, 512])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--weights", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    low = args.weights == "bfloat16"
    print(f"threads={args.threads}, weights {args.weights}; median us per call")
    header = (
        f"{'model':>13} {'N x K':>13} {'M':>4} {'oneDNN':>10} {'ours':>10} {'ours/oneDNN':>11} {'inv':>4}"
    )
    print(header)
    print("-" * len(header))
    for model in args.models:
        for n, k in SHAPES[model]:
            weight = (torch.randn(n, k) * 0.05).to(torch.bfloat16 if low else torch.float32)
            for m in args.batch_sizes:
                if n == SHAPES[model][-1][0] and m > LM_HEAD_MAX_BATCH:
                    continue
                x = torch.randn(m, k)
                x_onednn = x.bfloat16() if low else x
                onednn = median_seconds(lambda a=x_onednn, w=weight: F.linear(a, w), args.iterations) * 1e6
                ours = median_seconds(lambda a=x, w=weight: float_matmul(a, w), args.iterations) * 1e6
                same = torch.equal(F.linear(x_onednn, weight)[:1], F.linear(x_onednn[:1], weight))
                print(
                    f"{model:>13} {f'{n} x {k}':>13} {m:>4} {onednn:>10.1f} {ours:>10.1f} "
                    f"{ours / onednn:>10.2f}x {'yes' if same else 'no':>4}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
