"""The pipeline bubble, on the embedded model unless --model is given, one thread per rank:

- step time (default): decode step time at --pipeline-parallel-size 2 against 1, one batch at a time
  (PAGEDSERVE_PP_BATCH_QUEUE=0): a pp=2 step costs what a pp=1 step does plus the hand-over of the hidden
  states between stages, and the ratio is that overhead;
- --throughput: output tokens per second of --batch concurrent requests at pp=1, at pp=2 one batch at a
  time, and at pp=2 with its batch queue (two micro-batches in flight, the stages overlapped).

docs/benchmarks.md, Pipeline parallelism.

    python benchmarks/pp_bubble.py [--model PATH] [--batch 1] [--tokens 64] [--throughput]
"""

import argparse
import os
import time
from collections.abc import Callable

from pagedserve import LLM, SamplingParams

BATCH_QUEUE_ENV = "PAGEDSERVE_PP_BATCH_QUEUE"


Runner = Callable[[int], float]  # run(n): seconds for the batch's prompts to generate n tokens each


def measure(
    model: str | None, pp: int, batch_queue: bool, batch: int, use: Callable[[Runner], float]
) -> float:
    """`use(run)` on an engine of `pp` stages (with its batch queue or one batch at a time), `run(n)`
    timing `batch` prompts generating n tokens each."""
    os.environ[BATCH_QUEUE_ENV] = "1" if batch_queue else "0"
    llm = LLM(model, pipeline_parallel_size=pp, cpu_threads=1, max_model_len=512, enable_prefix_caching=False)
    try:
        return use(lambda n: _generate(llm, batch, n))
    finally:
        llm.llm_engine.client.shutdown()


def _generate(llm: LLM, batch: int, tokens: int) -> float:
    prompts = [{"prompt_token_ids": [1, 100 + i, 200, 300, 400]} for i in range(batch)]
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True), use_tqdm=False)
    return time.perf_counter() - start


def step_time(run: Runner, tokens: int) -> float:
    """Seconds per decode step: (time for `tokens` tokens - time for 1) / (tokens - 1), best of 3."""
    run(4)  # warm-up
    return min(run(tokens) - run(1) for _ in range(3)) / (tokens - 1)


def throughput(run: Runner, batch: int, tokens: int) -> float:
    """Output tokens per second (prefill included), best of 3."""
    run(4)  # warm-up
    return batch * tokens / min(run(tokens) for _ in range(3))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--throughput", action="store_true")
    args = parser.parse_args()
    if not args.throughput:
        times = {
            pp: measure(args.model, pp, False, args.batch, lambda run: step_time(run, args.tokens))
            for pp in (1, 2)
        }
        print(f"decode step, batch {args.batch}, one thread per rank")
        print("| pipeline stages | ms per step | vs pp=1 |\n|---|---:|---:|")
        for pp, seconds in times.items():
            print(f"| {pp} | {seconds * 1000:.2f} | {seconds / times[1]:.2f}x |")
        return
    settings = {"pp=1": (1, False), "pp=2, one batch at a time": (2, False), "pp=2, batch queue": (2, True)}
    rates = {
        name: measure(args.model, pp, queue, args.batch, lambda run: throughput(run, args.batch, args.tokens))
        for name, (pp, queue) in settings.items()
    }
    print(f"{args.batch} concurrent requests, {args.tokens} output tokens each, one thread per rank")
    print("| setting | output tok/s | vs pp=1 |\n|---|---:|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.1f} | {rate / rates['pp=1']:.2f}x |")


if __name__ == "__main__":
    main()
