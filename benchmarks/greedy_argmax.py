"""Does the greedy sampler's argmax gain from splitting rows over threads? numpy's float32 argmax over
[rows, vocab] logits on one thread, against half the rows on a second Python thread (numpy releases the GIL
in argmax), against the native kernel the sampler takes (kernels/cpu/greedy_argmax.cpp: rows over the
engine's OpenMP threads, `--threads` of them), and against one row that stays in cache (what the argmax
costs when memory does not limit it). Rounds alternate, so that the machine's load falls on every variant
alike.

    python benchmarks/greedy_argmax.py              # SmolLM2's vocabulary, batch 64
    python benchmarks/greedy_argmax.py --rows 128 --vocab 128256
"""

import argparse
import statistics
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from timing import median_seconds

from pagedserve.kernels.cpu import load_cpu_kernels


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="the native kernel's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logits = np.random.default_rng(0).standard_normal((args.rows, args.vocab), dtype=np.float32)
    one_row = logits[:1].copy()
    half = args.rows // 2
    pool = ThreadPoolExecutor(1)

    def two_threads() -> np.ndarray:
        other = pool.submit(logits[half:].argmax, 1)
        return np.concatenate([logits[:half].argmax(1), other.result()])

    variants = {
        "one thread": (lambda: logits.argmax(1), args.rows),
        "two threads": (two_threads, args.rows),
        "one row, in cache": (lambda: one_row.argmax(1), 1),
    }
    assert (two_threads() == logits.argmax(1)).all(), "the split must give numpy's own answer"
    if load_cpu_kernels().module is not None:
        tensor = torch.from_numpy(logits)
        native = torch.ops.pagedserve.greedy_argmax
        variants[f"native, {args.threads} threads"] = (lambda: native(tensor), args.rows)
        assert (native(tensor).numpy() == logits.argmax(1)).all(), "the kernel must give numpy's answer"
    medians: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (call, _) in variants.items():
            medians[name].append(median_seconds(call, 50))
    for name, (_, rows) in variants.items():
        seconds = statistics.median(medians[name])
        print(
            f"{name:<18} {seconds * 1e3:.3f} ms per call, {rows * args.vocab * 4 / seconds / 1e9:.0f} GB/s "
            f"(round medians {', '.join(f'{s * 1e3:.3f}' for s in medians[name])})"
        )


if __name__ == "__main__":
    main()
