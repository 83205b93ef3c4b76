"""Serving benchmark: a load generator for any OpenAI-compatible server (like `vllm bench serve`).

Sends --num-prompts streamed /v1/completions requests of vLLM's random dataset (seeded uniform input
lengths in [--input-len-min, --input-len-max], token ids avoiding special tokens, output lengths in
[--output-len-min, --output-len-max]) at --request-rate (inf: all at once; else Poisson arrivals), at
most --max-concurrency in flight, and measures TTFT, TPOT, ITL (mean, median, p99), request and token
throughput and failures. With --peer-base-url the same workload then runs against a second server and
the table shows both and their ratio. Prompts go as token ids (exact lengths; --text-prompts sends the
decoded text to servers that want strings). --dataset copy sends copy-heavy prompts instead (functions of
Python's standard library, to be copied out again): the workload where speculative decoding by prompt
lookup pays.

    python benchmarks/serving.py --base-url http://127.0.0.1:8000 --num-prompts 32 --max-concurrency 32 \\
        --input-len-min 32 --input-len-max 512 --output-len-max 64 --ignore-eos \\
        --peer-base-url http://127.0.0.1:8080 --peer-name llama.cpp
"""

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # throughput.py, however this file is run
from throughput import make_prompts  # noqa: E402

COMPLETED_FINISH_REASONS = ("stop", "length")


@dataclass
class RequestResult:
    """One request as the client saw it. Times in seconds."""

    ok: bool = False  # the response completed (finish_reason stop or length): an aborted one is not
    error: str = ""
    finish_reason: str | None = None
    status: int = 0  # HTTP status (0: no response)
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between streamed chunks after the first


@dataclass
class Workload:
    prompts: list[list[int]]
    texts: list[str] | None  # decoded prompts, with --text-prompts
    output_lens: list[int]
    arrival_gaps: list[float]  # seconds before sending each request


async def stream_request(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> RequestResult:
    """POST one streamed completion; time its chunks. Never raises: failures are counted."""
    result = RequestResult()
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as response:
            result.status = response.status_code
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("error"):
                    result.error = str(chunk["error"])[:200]
                    return result
                now = time.perf_counter()
                if chunk.get("choices") and chunk["choices"][0].get("finish_reason"):
                    result.finish_reason = chunk["choices"][0]["finish_reason"]
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    result.output_tokens += 1  # until usage says otherwise (one token per chunk)
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = repr(exc)
        return result
    result.latency = time.perf_counter() - start
    # NOTE: a stream cut by a deadline (finish_reason "abort", vLLM's too) got tokens but is no goodput.
    result.ok = result.ttft > 0.0 and result.finish_reason in COMPLETED_FINISH_REASONS
    if not result.ok:
        result.error = (
            "no token received"
            if result.ttft == 0.0
            else f"ended with finish_reason {result.finish_reason!r}"
        )
    return result


async def run_workload(
    base_url: str, model: str, workload: Workload, args: argparse.Namespace
) -> tuple[list[RequestResult], float]:
    """Send every request per the arrival schedule and concurrency limit; returns results and duration."""
    limit = asyncio.Semaphore(args.max_concurrency or len(workload.prompts))
    timeout = httpx.Timeout(args.request_timeout, connect=30)
    # NOTE: a fresh connection per request: llama-server closes idle keep-alive connections, and a request
    # sent on one it just closed failed with "Server disconnected" (1-2 of 8 in the one-at-a-time runs).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def one(index: int) -> RequestResult:
            prompt: Any = workload.texts[index] if workload.texts else workload.prompts[index]
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": workload.output_lens[index],
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if args.ignore_eos:
                body["ignore_eos"] = True
            async with limit:
                result = await stream_request(client, f"{base_url}/v1/completions", body)
            result.prompt_len = len(workload.prompts[index])
            return result

        start = time.perf_counter()
        tasks = []
        for index, gap in enumerate(workload.arrival_gaps):
            await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(index)))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def summarize(results: list[RequestResult], duration: float) -> dict[str, float]:
    """vLLM's serving metrics; times in milliseconds."""
    done = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in done)
    prompt = sum(r.prompt_len for r in done)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itls = [gap for r in done for gap in r.itl]
    summary = {
        "successful_requests": len(done),
        "failed_requests": len(results) - len(done),
        "duration_s": duration,
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput": len(done) / duration,
        "output_throughput": output / duration,
        "total_token_throughput": (prompt + output) / duration,
    }
    for name, values in (
        ("ttft", [r.ttft for r in done]),
        ("tpot", tpots),
        ("itl", itls),
        ("e2el", [r.latency for r in done]),
    ):
        array = np.array(values or [0.0]) * 1000
        summary |= {
            f"mean_{name}_ms": float(array.mean()),
            f"median_{name}_ms": float(np.median(array)),
            f"p99_{name}_ms": float(np.percentile(array, 99)),
        }
    return summary


ROWS = [
    ("Successful requests", "successful_requests", "{:.0f}"),
    ("Failed requests", "failed_requests", "{:.0f}"),
    ("Benchmark duration (s)", "duration_s", "{:.2f}"),
    ("Total input tokens", "total_input_tokens", "{:.0f}"),
    ("Total generated tokens", "total_output_tokens", "{:.0f}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.2f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.2f}"),
] + [
    (f"{stat} {label} (ms)", f"{stat.lower()}_{key}_ms", "{:.2f}")
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency"))
    for stat in ("Mean", "Median", "P99")
]


def print_table(columns: list[tuple[str, dict[str, float]]]) -> None:
    """One row per metric, one column per server, plus first/second when there are two."""
    names = [name for name, _ in columns] + (["ratio"] if len(columns) == 2 else [])
    print(f"{'':34}" + "".join(f"{name:>16}" for name in names))
    for label, key, fmt in ROWS:
        cells = [fmt.format(summary[key]) for _, summary in columns]
        if len(columns) == 2:
            peer = columns[1][1][key]
            cells.append(f"{columns[0][1][key] / peer:.2f}x" if peer else "-")
        print(f"{label:34}" + "".join(f"{cell:>16}" for cell in cells))


def copy_prompts(tokenizer: Any, num: int, seed: int) -> list[list[int]]:
    """Prompts asking to copy a function of Python's standard library (200-1500 characters of source)."""
    import importlib
    import inspect

    sources = []
    for name in (
        "textwrap",
        "json.encoder",
        "json.decoder",
        "shlex",
        "fnmatch",
        "calendar",
        "difflib",
        "string",
        "colorsys",
        "heapq",
        "bisect",
        "base64",
    ):
        module = importlib.import_module(name)
        for _, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ == name:
                source = inspect.getsource(function)
                if 200 <= len(source) <= 1500:
                    sources.append(source)
    order = np.random.default_rng(seed).permutation(len(sources))
    return [
        tokenizer.encode(
            f"Copy the following Python code exactly.\n\n```python\n{sources[i]}```\n\nCopy:\n```python\n"
        )
        for i in order[:num]
    ]


def build_workload(args: argparse.Namespace) -> Workload:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or _default_tokenizer())
    if args.dataset == "copy":
        prompts = copy_prompts(tokenizer, args.num_prompts, args.seed)
    else:
        prompts = make_prompts(tokenizer, args.num_prompts, args.input_len_min, args.input_len_max, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    output_min = args.output_len_min or args.output_len_max
    output_lens = rng.integers(output_min, args.output_len_max + 1, size=args.num_prompts).tolist()
    if args.request_rate == float("inf"):
        gaps = [0.0] * args.num_prompts
    else:
        gaps = rng.exponential(1.0 / args.request_rate, size=args.num_prompts).tolist()
    texts = [tokenizer.decode(p) for p in prompts] if args.text_prompts else None
    return Workload(prompts, texts, output_lens, gaps)


def _default_tokenizer() -> str:
    from pagedserve.utils.default_model import default_model_path
    from pagedserve.utils.gguf_cache import gguf_hf_folder

    return gguf_hf_folder(default_model_path())


def served_model(base_url: str, model: str | None) -> str:
    """--model, else the server's first model (GET /v1/models)."""
    if model:
        return model
    return httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"][0]["id"]


def add_workload_args(
    parser: argparse.ArgumentParser, input_len: tuple[int, int], output_len_max: int
) -> None:
    """The flags `build_workload` reads (this script's and overload.py's, with their own defaults)."""
    parser.add_argument(
        "--dataset",
        choices=("random", "copy"),
        default="random",
        help="random: vLLM's random token ids (--input-len-*); copy: copy-heavy prompts.",
    )
    parser.add_argument("--input-len-min", type=int, default=input_len[0])
    parser.add_argument("--input-len-max", type=int, default=input_len[1])
    parser.add_argument("--output-len-min", type=int, help="Default: --output-len-max (fixed length).")
    parser.add_argument("--output-len-max", type=int, default=output_len_max)
    parser.add_argument("--tokenizer", help="HF tokenizer of the dataset (default: the embedded model's).")
    parser.add_argument("--seed", type=int, default=0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="The server under test.")
    parser.add_argument("--model", help="Model name in requests (default: the server's first model).")
    parser.add_argument("--name", default="pagedserve", help="Column title of the server under test.")
    parser.add_argument("--peer-base-url", help="A second server to run the same workload against.")
    parser.add_argument("--peer-model", help="Model name for the peer (default: its first model).")
    parser.add_argument("--peer-name", default="peer", help="Column title of the peer.")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="Requests per second, Poisson arrivals; inf sends all at once.",
    )
    parser.add_argument("--max-concurrency", type=int, help="Most requests in flight (default: all).")
    add_workload_args(parser, input_len=(32, 512), output_len_max=64)
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="Ask for exactly max_tokens (vLLM's and llama.cpp's ignore_eos field).",
    )
    parser.add_argument("--text-prompts", action="store_true", help="Send decoded text, not token ids.")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="Seconds per request.")
    parser.add_argument("--result-json", help="Also write the summaries to this file.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workload = build_workload(args)
    targets = [(args.name, args.base_url, args.model)]
    if args.peer_base_url:
        targets.append((args.peer_name, args.peer_base_url, args.peer_model))
    columns = []
    for name, base_url, model in targets:
        results, duration = asyncio.run(run_workload(base_url, served_model(base_url, model), workload, args))
        columns.append((name, summarize(results, duration)))
        for error in sorted({r.error for r in results if not r.ok})[:5]:
            print(f"{name}: failed request: {error}", file=sys.stderr)
    lengths = [len(p) for p in workload.prompts]
    print(
        f"{args.num_prompts} {args.dataset} prompts, input {min(lengths)}-{max(lengths)} tokens, output "
        f"{args.output_len_min or args.output_len_max}-{args.output_len_max} tokens, request rate "
        f"{args.request_rate}, max concurrency {args.max_concurrency or args.num_prompts}"
    )
    print_table(columns)
    if args.result_json:
        with open(args.result_json, "w", encoding="utf-8") as file:
            json.dump(
                {"args": vars(args) | {"request_rate": str(args.request_rate)}, "results": dict(columns)},
                file,
                indent=2,
            )
    return 0 if all(summary["failed_requests"] == 0 for _, summary in columns) else 1


if __name__ == "__main__":
    sys.exit(main())
