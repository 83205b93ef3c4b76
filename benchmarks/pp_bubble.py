"""The pipeline bubble: decode step time at --pipeline-parallel-size 2 against 1 (one thread per rank), on
the embedded model unless --model is given. Stages run one after another (no micro-batches overlap them
yet), so a pp=2 step costs what a pp=1 step does plus the hand-over of the hidden states between stages:
the ratio is that overhead (docs/benchmarks.md, Pipeline parallelism).

    python benchmarks/pp_bubble.py [--model PATH] [--batch 1] [--tokens 64]
"""

import argparse
import time

from pagedserve import LLM, SamplingParams


def step_time(model: str | None, pp: int, batch: int, tokens: int) -> float:
    """Seconds per decode step: (time for `tokens` tokens - time for 1) / (tokens - 1), best of 3."""
    llm = LLM(model, pipeline_parallel_size=pp, cpu_threads=1, max_model_len=512, enable_prefix_caching=False)
    prompts = [[1, 100 + i, 200, 300, 400] for i in range(batch)]

    def run(n: int) -> float:
        start = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - start

    run(4)  # warm-up
    best = min(run(tokens) - run(1) for _ in range(3))
    llm.llm_engine.client.shutdown()
    return best / (tokens - 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    times = {pp: step_time(args.model, pp, args.batch, args.tokens) for pp in (1, 2)}
    print(f"decode step, batch {args.batch}, one thread per rank")
    print("| pipeline stages | ms per step | vs pp=1 |\n|---|---:|---:|")
    for pp, seconds in times.items():
        print(f"| {pp} | {seconds * 1000:.2f} | {seconds / times[1]:.2f}x |")


if __name__ == "__main__":
    main()
