"""KV memory: paging's waste and concurrency, sharing's savings, and prefix caching's speed, in one table.

1. Waste and concurrency, per block size: vLLM's random workload (seeded prompt and output lengths) runs
   in a KV budget of --kv-budget-tokens. Waste = allocated slots minus tokens stored, over allocated,
   summed over the engine's steps; the peer is a contiguous reservation of max_model_len slots per
   running request (the same steps). Concurrency = requests running at once while some still wait
   (mean and peak), against budget // max_model_len contiguous reservations.
2. Sharing: --sharing-prompts prompts with n samples, and beam searches of each width. Per step the
   engine reports the blocks in use and the blocks its holders would need on top without sharing;
   savings = extra over (used + extra), summed over steps, and the peaks side by side.
3. Shared system prompt: --prefix-requests requests = one --prefix-len token prefix + a short suffix,
   all submitted at once, with prefix caching on and off: throughput and mean time to first token.

    python benchmarks/kv_memory.py                     # SmolLM2-135M (the default model), full sizes
    python benchmarks/kv_memory.py --num-requests 8 --output-len-max 16 --widths 2 --prefix-len 64 ...
"""

import argparse
import gc
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # throughput, however this file is run
import numpy as np  # noqa: E402
import torch  # noqa: E402
from throughput import make_prompts  # noqa: E402

from pagedserve import LLM, BeamSearchParams, EngineArgs, SamplingParams  # noqa: E402
from pagedserve.engine.tokenizer import load_tokenizer  # noqa: E402
from pagedserve.protocol import SchedulerStats  # noqa: E402

Row = tuple[str, str, str, str]  # section, setting, pagedserve, peer / ratio


@dataclass
class Trace:
    """Scheduler statistics after every step of one run."""

    stats: list[SchedulerStats] = field(default_factory=list)
    seconds: float = 0.0

    def total(self, name: str) -> int:
        return sum(getattr(s, name) for s in self.stats)


def make_llm(args: argparse.Namespace, **engine_args: Any) -> LLM:
    """An engine with an explicit KV size (so one run's leftovers never shrink the next's) and no swap
    space (nothing here needs it)."""
    if "num_gpu_blocks_override" not in engine_args:
        engine_args["kv_cache_memory"] = args.kv_cache_memory
    return LLM(args.model, max_model_len=args.max_model_len, swap_space=0, **engine_args)


def release(llm: LLM) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def drive(
    llm: LLM,
    prompts: list[list[int]],
    params: list[SamplingParams],
    beam_search: BeamSearchParams | None = None,
) -> Trace:
    """Submit everything, step the engine to the end, record its statistics after each step."""
    engine, trace = llm.llm_engine, Trace()
    for index, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(index), {"prompt_token_ids": prompt}, p, beam_search=beam_search)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        trace.stats.append(engine.engine_core.get_stats())
    trace.seconds = time.perf_counter() - start
    return trace


def waste_and_concurrency(args: argparse.Namespace, tokenizer: Any) -> list[Row]:
    rng = np.random.default_rng(args.seed)
    prompts = make_prompts(tokenizer, args.num_requests, args.input_len_min, args.input_len_max, args.seed)
    params = [
        SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=int(n))
        for n in rng.integers(args.output_len_min, args.output_len_max + 1, size=len(prompts))
    ]
    contiguous_fit = args.kv_budget_tokens // args.max_model_len
    rows: list[Row] = []
    for block_size in args.block_sizes:
        llm = make_llm(
            args,
            block_size=block_size,
            enable_prefix_caching=False,
            num_gpu_blocks_override=args.kv_budget_tokens // block_size + 1,
        )
        trace = drive(llm, prompts, params)
        stored = trace.total("num_kv_tokens_stored")
        waste = 1 - stored / trace.total("num_kv_slots_allocated")
        reserved = sum(s.num_running_reqs for s in trace.stats) * args.max_model_len
        # NOTE: everyone is queued at once: while some wait, the running ones are all that fit.
        running = [s.num_running_reqs for s in trace.stats]
        saturated = [s.num_running_reqs for s in trace.stats if s.num_waiting_reqs] or [max(running)]
        rows.append(
            (
                "KV waste (allocated - stored) / allocated",
                f"block {block_size}",
                f"{waste:.1%}",
                f"contiguous max_model_len reservation: {1 - stored / reserved:.1%}",
            )
        )
        rows.append(
            (
                f"requests running at once in {args.kv_budget_tokens} KV tokens",
                f"block {block_size}",
                f"mean {np.mean(saturated):.1f}, peak {max(running)} "
                f"({trace.stats[-1].num_preemptions_total} preemptions)",
                f"contiguous: {contiguous_fit} ({np.mean(saturated) / max(contiguous_fit, 1):.1f}x)",
            )
        )
        release(llm)
    return rows


def sharing(args: argparse.Namespace, tokenizer: Any) -> list[Row]:
    llm = make_llm(args, enable_prefix_caching=False)
    prompts = make_prompts(
        tokenizer, args.sharing_prompts, args.sharing_prompt_len, args.sharing_prompt_len, args.seed + 1
    )
    rows: list[Row] = []
    for width in args.widths:
        runs = {
            f"parallel sampling n={width}": drive(
                llm,
                prompts,
                [
                    SamplingParams(
                        n=width,
                        temperature=1.0,
                        seed=args.seed,
                        max_tokens=args.sharing_max_tokens,
                        ignore_eos=True,
                    )
                ]
                * len(prompts),
            ),
            f"beam search width={width}": drive(
                llm,
                prompts,
                [SamplingParams(n=width, temperature=0.0, max_tokens=args.sharing_max_tokens)] * len(prompts),
                BeamSearchParams(width, args.sharing_max_tokens, ignore_eos=True),
            ),
        }
        usable = llm.llm_engine.engine_core.kv_cache_config.num_blocks - 1
        for setting, trace in runs.items():
            used = [round(s.kv_cache_usage * usable) for s in trace.stats]
            saved = [s.num_blocks_saved for s in trace.stats]
            savings = sum(saved) / max(1, sum(used) + sum(saved))
            peak = max(range(len(used)), key=lambda i: used[i] + saved[i])
            rows.append(
                (
                    "KV blocks saved by sharing",
                    setting,
                    f"{savings:.1%} saved",
                    f"peak {used[peak]} blocks vs {used[peak] + saved[peak]} unshared",
                )
            )
    release(llm)
    return rows


def shared_prefix(args: argparse.Namespace, tokenizer: Any) -> list[Row]:
    prefix = make_prompts(tokenizer, 1, args.prefix_len, args.prefix_len, args.seed + 2)[0]
    suffixes = make_prompts(tokenizer, args.prefix_requests, 16, 64, args.seed + 3)
    prompts = [{"prompt_token_ids": prefix + suffix} for suffix in suffixes]
    params = SamplingParams(temperature=0.0, max_tokens=args.prefix_max_tokens, ignore_eos=True)
    results = {}
    for caching in (True, False):
        llm = make_llm(args, enable_prefix_caching=caching)
        llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up (and, on, the prefix cached once)
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        ttft = np.mean([o.metrics["first_token_time"] - o.metrics["arrival_time"] for o in outputs])
        results[caching] = (len(prompts) / seconds, ttft)
        release(llm)
    (on_rate, on_ttft), (off_rate, off_ttft) = results[True], results[False]
    setting = f"{args.prefix_requests} requests, {args.prefix_len}-token common prefix"
    return [
        (
            "shared system prompt: prefix caching on (off)",
            setting,
            f"{on_rate:.2f} req/s, TTFT {on_ttft * 1000:.0f} ms",
            f"off: {off_rate:.2f} req/s, TTFT {off_ttft * 1000:.0f} ms; {on_rate / off_rate:.2f}x throughput",
        )
    ]


def print_table(rows: list[Row]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    header = ("measure", "setting", "pagedserve", "peer / baseline")
    widths = [max(w, len(h)) for w, h in zip(widths, header)]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    add = parser.add_argument
    add("--model", default=None, help="Default: the embedded SmolLM2-135M.")
    add("--seed", type=int, default=0)
    add("--max-model-len", type=int, default=2048, help="The contiguous peer reserves this much per request.")
    add("--block-sizes", type=ints, default=[8, 16, 32])
    add("--kv-cache-memory", default="2GiB", help="KV pool of the sharing and prefix runs.")
    add("--num-requests", type=int, default=128)
    add("--input-len-min", type=int, default=16)
    add("--input-len-max", type=int, default=1024)
    add("--output-len-min", type=int, default=16)
    add("--output-len-max", type=int, default=256)
    add("--kv-budget-tokens", type=int, default=32768, help="KV pool of the waste/concurrency runs.")
    add("--widths", type=ints, default=[2, 4, 6], help="n of parallel sampling and beam widths.")
    add("--sharing-prompts", type=int, default=16)
    add("--sharing-prompt-len", type=int, default=512)
    add("--sharing-max-tokens", type=int, default=128)
    add("--prefix-len", type=int, default=1000)
    add("--prefix-requests", type=int, default=64)
    add("--prefix-max-tokens", type=int, default=32)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    tokenizer = load_tokenizer(EngineArgs(model=args.model, device="cpu").create_engine_config().model)
    rows = waste_and_concurrency(args, tokenizer) + sharing(args, tokenizer) + shared_prefix(args, tokenizer)
    print_table(rows)


if __name__ == "__main__":
    main()
