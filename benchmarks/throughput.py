"""Offline throughput: pagedserve against HF transformers `generate` on vLLM's random dataset.

Prompts: seeded input lengths uniform in [--input-len-min, --input-len-max], token ids drawn uniformly from
the vocabulary minus special/added tokens; every request generates exactly --output-len tokens (ignore_eos).
pagedserve is driven step by step to time each step and sample KV waste (allocated KV slots minus tokens
stored, over allocated). HF runs one request at a time on a few prompts (its rate does not depend on the
count) and in static left-padded batches.

    python benchmarks/throughput.py --num-prompts 64 --output-len 128 --json results.json

Large configurations without weights: `--model benchmarks/configs/llama-8b --load-format dummy` gives
both engines random weights of that config (pagedserve's dummy loader; HF's `from_config`), with the
embedded SmolLM2 tokenizer unless --tokenizer says otherwise.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # hf_peer, however this file is run
from hf_peer import PeerResult, load_model, load_tokenizer, run_hf_batched, run_hf_single  # noqa: E402


@dataclass
class StepTrace:
    """What driving the engine to completion measured."""

    output_tokens: int = 0
    step_times: list[float] = field(default_factory=list)
    decode_step_times: list[float] = field(default_factory=list)  # steps where every running request decoded
    kv_allocated: int = 0  # summed over steps with any KV allocated
    kv_stored: int = 0

    @property
    def kv_waste(self) -> float:
        return 1.0 - self.kv_stored / self.kv_allocated if self.kv_allocated else 0.0


def make_prompts(tokenizer: Any, num: int, len_min: int, len_max: int, seed: int) -> list[list[int]]:
    """vLLM's random dataset: seeded uniform lengths, uniform ids avoiding special and added tokens."""
    rng = np.random.default_rng(seed)
    excluded = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    allowed = np.array([t for t in range(tokenizer.vocab_size) if t not in excluded])
    lengths = rng.integers(len_min, len_max + 1, size=num)
    return [rng.choice(allowed, size=int(n)).tolist() for n in lengths]


def drive(engine: Any, prompts: list[list[int]], params: Any, tag: str) -> StepTrace:
    """Add all prompts, step the engine until done, timing steps and sampling the scheduler's stats.
    A step counts as a decode step when nothing waits and every running request already had output and
    got one more token (no prefill chunk in it)."""
    for i, ids in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": ids}, params)
    scheduler = engine.engine_core.scheduler
    trace, produced = StepTrace(), {}  # request id -> output tokens so far
    before = scheduler.get_stats()
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        outs = engine.step()
        took = time.perf_counter() - start
        trace.step_times.append(took)
        counts = {o.request_id: len(o.outputs[0].token_ids) for o in outs}
        if (
            before.num_waiting_reqs == 0
            and len(outs) == before.num_running_reqs > 0
            and all(produced.get(rid, 0) >= 1 for rid in counts)
        ):
            trace.decode_step_times.append(took)
        produced.update(counts)
        trace.output_tokens += sum(counts[o.request_id] for o in outs if o.finished)
        before = scheduler.get_stats()
        if before.num_kv_slots_allocated > 0:
            trace.kv_allocated += before.num_kv_slots_allocated
            trace.kv_stored += before.num_kv_tokens_stored
    return trace


def run_pagedserve(args: argparse.Namespace, prompts: list[list[int]]) -> tuple[PeerResult, StepTrace]:
    from pagedserve import LLM, SamplingParams

    kwargs = {
        "model": args.model,
        "dtype": args.dtype,
        "block_size": args.block_size,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_cache_memory": args.kv_cache_memory,
        "tensor_parallel_size": args.tensor_parallel_size,
        "load_format": args.load_format,
        "tokenizer": args.tokenizer,
        "max_model_len": args.max_model_len,
        "enforce_eager": args.enforce_eager,
        "attention_backend": args.attention_backend,
        "batch_invariant": args.batch_invariant,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "cpu_offload_gb": args.cpu_offload_gb,
    }
    llm = LLM(**{k: v for k, v in kwargs.items() if v is not None})
    engine = llm.llm_engine
    drive(
        engine,
        [ids[:16] for ids in prompts[:2]],
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        "warmup",
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    start = time.perf_counter()
    trace = drive(engine, prompts, params, "bench")
    elapsed = time.perf_counter() - start
    expected = len(prompts) * args.output_len
    if trace.output_tokens != expected:
        print(
            f"WARNING: pagedserve produced {trace.output_tokens} output tokens, expected {expected}",
            file=sys.stderr,
        )
    return PeerResult("pagedserve", len(prompts), sum(map(len, prompts)), trace.output_tokens, elapsed), trace


def _ms(times: list[float]) -> tuple[float, float]:
    """(mean, p50) in milliseconds; NaN when empty."""
    return (statistics.mean(times) * 1e3, statistics.median(times) * 1e3) if times else (float("nan"),) * 2


def report(results: list[PeerResult], trace: StepTrace | None) -> dict[str, Any]:
    """Print the markdown table (with pagedserve / HF ratios) and return the figures for --json."""
    header = "| Run | Requests | Elapsed (s) | Requests/s | Output tok/s | Total tok/s |"
    lines = [header, "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r.name} | {r.num_requests} | {r.elapsed_s:.2f} | {r.requests_per_s:.3f} "
            f"| {r.output_tokens_per_s:.1f} | {r.total_tokens_per_s:.1f} |"
        )
    ours = next((r for r in results if r.name == "pagedserve"), None)
    ratios = {}
    for peer in (r for r in results if ours is not None and r is not ours):
        ratio = [
            ours.requests_per_s / peer.requests_per_s,
            ours.output_tokens_per_s / peer.output_tokens_per_s,
            ours.total_tokens_per_s / peer.total_tokens_per_s,
        ]
        ratios[f"pagedserve / {peer.name}"] = ratio
        lines.append(
            f"| **pagedserve / {peer.name}** | | | {ratio[0]:.2f}x | {ratio[1]:.2f}x | {ratio[2]:.2f}x |"
        )
    summary: dict[str, Any] = {
        "results": [
            dict(
                asdict(r),
                requests_per_s=r.requests_per_s,
                output_tokens_per_s=r.output_tokens_per_s,
                total_tokens_per_s=r.total_tokens_per_s,
            )
            for r in results
        ],
        "ratios": ratios,
    }
    if trace is not None:
        (step_mean, step_p50), (dec_mean, dec_p50) = _ms(trace.step_times), _ms(trace.decode_step_times)
        lines += [
            "",
            f"pagedserve: KV waste {trace.kv_waste:.1%} (allocated slots minus tokens stored, "
            f"over allocated, summed over {len(trace.step_times)} steps)",
            f"pagedserve: decode step mean {dec_mean:.2f} ms, p50 {dec_p50:.2f} ms "
            f"({len(trace.decode_step_times)} steps); all steps mean {step_mean:.2f} ms, p50 {step_p50:.2f} ms",
        ]
        summary["pagedserve"] = {
            "kv_waste": trace.kv_waste,
            "num_steps": len(trace.step_times),
            "num_decode_steps": len(trace.decode_step_times),
            "decode_step_ms_mean": dec_mean,
            "decode_step_ms_p50": dec_p50,
            "step_ms_mean": step_mean,
            "step_ms_p50": step_p50,
        }
    print("\n".join(lines))
    return summary


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default=None, help="HF folder or GGUF file (default: embedded SmolLM2-135M GGUF)"
    )
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len-min", type=int, default=32)
    p.add_argument("--input-len-max", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--kv-cache-memory", default=None, help="e.g. 4GiB")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument(
        "--load-format",
        default="auto",
        choices=["auto", "dummy"],
        help="dummy: random weights of --model's config.json (both engines), no checkpoint",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder (default: the model's; with --load-format dummy: the embedded SmolLM2's)",
    )
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--cpu-offload-gb", type=float, default=None, help="GiB of weights in host memory")
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--enforce-eager", action="store_true", help="pagedserve without CUDA graphs")
    p.add_argument(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--no-batch-invariant: float32 layers on oneDNN (the engine flag)",
    )
    p.add_argument("--skip-hf", action="store_true", help="do not run the HF transformers peers")
    p.add_argument("--skip-pagedserve", action="store_true", help="only run the HF peers (development)")
    p.add_argument("--hf-single-prompts", type=int, default=4, help="prompts for HF one-at-a-time (0: skip)")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--hf-batch-prompts", type=int, default=None, help="prompts for HF batched (default: all)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    args = p.parse_args()
    if not 1 <= args.input_len_min <= args.input_len_max:
        p.error("need 1 <= --input-len-min <= --input-len-max")
    if args.load_format == "dummy" and args.tokenizer is None:
        from pagedserve.utils.default_model import default_model_path
        from pagedserve.utils.gguf_cache import gguf_hf_folder

        args.tokenizer = gguf_hf_folder(default_model_path())
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    prompts = make_prompts(tokenizer, args.num_prompts, args.input_len_min, args.input_len_max, args.seed)
    results: list[PeerResult] = []
    trace = None
    if not args.skip_pagedserve:
        ours, trace = run_pagedserve(args, prompts)
        results.append(ours)
        gc.collect()  # the engine, its KV cache included, before HF loads its copy of the model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if not args.skip_hf:
        hf_model, device = load_model(args.model, args.dtype, dummy=args.load_format == "dummy")
        if args.hf_single_prompts > 0:
            results.append(
                run_hf_single(hf_model, device, tokenizer, prompts[: args.hf_single_prompts], args.output_len)
            )
        batch_prompts = prompts[: args.hf_batch_prompts] if args.hf_batch_prompts is not None else prompts
        if batch_prompts:
            results.append(
                run_hf_batched(
                    hf_model, device, tokenizer, batch_prompts, args.output_len, args.hf_batch_size
                )
            )
    summary = report(results, trace)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), **summary}, f, indent=2)


if __name__ == "__main__":
    main()
