"""The batched multi-LoRA op on CPU at SmolLM2-135M's shapes (rank 16 beside q/k/v, o, gate/up and down):
the native `add_lora` against the torch reference (`add_lora_reference`), same inputs, float32. Batches:
decode steps (one token per request, the requests round robin over 8 adapters) and a prefill chunk of one
adapter. Median microseconds per call, summed over the four layers of one decoder layer.

    python benchmarks/lora_kernels.py --threads 2
"""

import argparse
import os
import sys
from collections.abc import Callable

import torch

from pagedserve.lora.ops import add_lora, add_lora_reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing, however this file is run
from timing import median_seconds  # noqa: E402

# (in, out, fused projections) of SmolLM2-135M's layers: q/k/v, o, gate/up, down
LAYERS = [(576, 960, 3), (576, 576, 1), (576, 3072, 2), (1536, 576, 1)]
ADAPTERS = 8


def batches(tokens: int) -> dict[str, torch.Tensor]:
    """Slots of each batch kind at `tokens` tokens."""
    return {
        f"decode {tokens}": torch.arange(tokens) % ADAPTERS,
        f"prefill {tokens}": torch.zeros(tokens, dtype=torch.int64),
    }


def layer_seconds(slots: torch.Tensor, rank: int, op: Callable[..., None], iterations: int) -> float:
    """One decoder layer's four add_lora calls on `slots`, median seconds."""
    total = 0.0
    for size_in, size_out, fused in LAYERS:
        width = rank * fused
        args = (
            torch.randn(len(slots), size_out),  # y
            torch.randn(len(slots), size_in),  # x
            torch.randn(ADAPTERS, width, size_in) * 0.02,  # lora_a
            torch.randn(ADAPTERS, width, size_out) * 0.02,  # lora_b [S, R, out]: add_lora's layout
            slots,
        )
        total += median_seconds(lambda args=args: op(*args), iterations)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 512])
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"rank {args.rank}, {args.threads} threads, float32; microseconds per decoder layer (4 calls)")
    print("| batch | native | torch reference | reference / native |\n|---|---:|---:|---:|")
    for tokens in args.tokens:
        for name, slots in batches(tokens).items():
            if tokens == 1 and name.startswith("prefill"):
                continue  # the same batch as a decode of one
            native = layer_seconds(slots, args.rank, add_lora, args.iterations)
            reference = layer_seconds(slots, args.rank, add_lora_reference, args.iterations)
            print(f"| {name} | {native * 1e6:.1f} | {reference * 1e6:.1f} | {reference / native:.1f}x |")


if __name__ == "__main__":
    main()
