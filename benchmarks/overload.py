"""Overload benchmark: offered load ramped from 0.5x to 8x the server's capacity, per level: goodput,
p99 TTFT, rejected %, deadline-aborted streams, other errors, preemptions, recomputed tokens, and peak
memory (server RSS, KV usage).

Capacity is measured first (requests per second at saturation: --calibration-requests, with
--calibration-concurrency of them in flight), unless --capacity-rps gives it. Each level then sends Poisson
arrivals at level x capacity for --level-duration seconds (vLLM's random dataset, streamed
/v1/completions, ignore_eos). Goodput: requests per second that completed in full (finish_reason stop
or length: a deadline-aborted stream is not) with TTFT within --slo-ttft. Targets (issue 5): goodput at
8x >= 90% of the peak goodput, memory flat, no 5xx but the
deliberate 503s. With --peer-base-url the same ramp runs against a second server (e.g. one without
admission limits) and the table adds its goodput and the ratio.

The server is started by the benchmark (--serve "MODEL FLAGS...", on 127.0.0.1, RSS measured over its
process tree) or already running (--base-url, with --server-pid for RSS):

    python benchmarks/overload.py --serve "MODEL --max-num-queued-requests 64 --max-queue-time 10 \\
        --request-timeout 120" --input-len-min 64 --input-len-max 1024 --output-len-max 256
"""

import argparse
import asyncio
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # serving.py, however this file is run
from serving import (  # noqa: E402
    RequestResult,
    Workload,
    add_workload_args,
    build_workload,
    run_workload,
    served_model,
)

LEVELS = (0.5, 1.0, 2.0, 4.0, 8.0)


@dataclass
class Level:
    """One load level's outcome."""

    factor: float
    offered_rps: float
    sent: int
    completed: int
    goodput_rps: float
    p99_ttft_ms: float
    rejected_pct: float  # 503 with Retry-After: the deliberate refusals
    aborted: int  # streams cut by a deadline (finish_reason "abort"): deliberate too, and no goodput
    other_errors: int  # anything else: 5xx, timeouts, broken streams
    preemptions: int
    recomputed_tokens: int
    peak_kv_pct: float
    peak_rss_mib: float


class ServerProbe:
    """Samples /metrics and the server's RSS while a level runs."""

    def __init__(self, base_url: str, pid: int | None) -> None:
        self.base_url, self.pid = base_url, pid
        self.peak_kv = self.peak_rss = 0.0

    def counters(self) -> dict[str, float]:
        text = httpx.get(f"{self.base_url}/metrics", timeout=30).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("pagedserve:") and "{" in line:
                values[line.split("{")[0]] = values.get(line.split("{")[0], 0.0) + float(
                    line.rsplit(" ", 1)[1]
                )
        return values

    def rss_bytes(self) -> int:
        if self.pid is None:
            return 0
        try:
            root = psutil.Process(self.pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            return 0

    async def sample_until(self, done: asyncio.Event) -> None:
        self.peak_kv = self.peak_rss = 0.0
        while not done.is_set():
            try:
                kv = await asyncio.to_thread(self.counters)
                self.peak_kv = max(self.peak_kv, kv.get("pagedserve:kv_cache_usage_perc", 0.0))
            except httpx.HTTPError:
                pass  # a busy server answers late: the next sample counts
            self.peak_rss = max(self.peak_rss, self.rss_bytes())
            await asyncio.sleep(0.5)


def level_workload(args: argparse.Namespace, rate: float, seed: int) -> Workload:
    """Poisson arrivals at `rate` for the level's duration (at least 8 requests)."""
    num = max(8, int(rate * args.level_duration))
    return build_workload(
        argparse.Namespace(**{**vars(args), "num_prompts": num, "request_rate": rate, "seed": seed})
    )


async def run_level(
    base_url: str, model: str, workload: Workload, args: argparse.Namespace, probe: ServerProbe
) -> tuple[list[RequestResult], float]:
    done = asyncio.Event()
    sampler = asyncio.create_task(probe.sample_until(done))
    try:
        return await run_workload(base_url, model, workload, args)
    finally:
        done.set()
        await sampler


def measure_level(
    factor: float, capacity: float, base_url: str, model: str, args: argparse.Namespace, probe: ServerProbe
) -> Level:
    rate = factor * capacity
    workload = level_workload(args, rate, args.seed + int(factor * 100))
    before = probe.counters()
    results, duration = asyncio.run(run_level(base_url, model, workload, args, probe))
    after = probe.counters()
    good = [r for r in results if r.ok and r.ttft <= args.slo_ttft]
    ttfts = [r.ttft for r in results if r.ok] or [0.0]
    delta = lambda name: int(after.get(name, 0) - before.get(name, 0))  # noqa: E731
    return Level(
        factor,
        rate,
        len(results),
        sum(r.ok for r in results),
        len(good) / duration,
        float(np.percentile(ttfts, 99)) * 1000,
        100 * sum(r.status == 503 for r in results) / len(results),
        sum(r.finish_reason == "abort" for r in results),
        sum(not r.ok and r.status != 503 and r.finish_reason != "abort" for r in results),
        delta("pagedserve:num_preemptions_total"),
        delta("pagedserve:num_recomputed_tokens_total"),
        100 * probe.peak_kv,
        probe.peak_rss / 2**20,
    )


def calibrate(base_url: str, model: str, args: argparse.Namespace) -> float:
    """Completed requests per second at saturation: --calibration-concurrency requests kept in flight
    (all at once would run into the server's own queue limits and measure its refusals)."""
    workload = build_workload(
        argparse.Namespace(
            **{**vars(args), "num_prompts": args.calibration_requests, "request_rate": float("inf")}
        )
    )
    closed_loop = argparse.Namespace(**{**vars(args), "max_concurrency": args.calibration_concurrency})
    results, duration = asyncio.run(run_workload(base_url, model, workload, closed_loop))
    completed = sum(r.ok for r in results)
    if not completed:
        raise SystemExit(f"Calibration failed: {sorted({r.error for r in results})[:3]}")
    return completed / duration


def print_table(title: str, levels: list[Level], peer: list[Level] | None) -> None:
    peak = max(level.goodput_rps for level in levels) or 1.0
    header = (
        f"{'load':>5} {'offered/s':>9} {'sent':>5} {'done':>5} {'goodput/s':>9} {'% peak':>6} "
        f"{'p99 TTFT ms':>11} {'rejected%':>9} {'aborted':>7} {'errors':>6} {'preempt':>7} {'recomputed':>10} "
        f"{'peak KV%':>8} {'peak RSS MiB':>12}"
    )
    print(title)
    print(header + (f" {'peer goodput/s':>14} {'ratio':>6}" if peer else ""))
    for index, level in enumerate(levels):
        row = (
            f"{level.factor:>4.1f}x {level.offered_rps:>9.2f} {level.sent:>5} {level.completed:>5} "
            f"{level.goodput_rps:>9.2f} {100 * level.goodput_rps / peak:>6.0f} {level.p99_ttft_ms:>11.0f} "
            f"{level.rejected_pct:>9.1f} {level.aborted:>7} {level.other_errors:>6} {level.preemptions:>7} "
            f"{level.recomputed_tokens:>10} {level.peak_kv_pct:>8.1f} {level.peak_rss_mib:>12.0f}"
        )
        if peer:
            other = peer[index].goodput_rps
            row += f" {other:>14.2f} {level.goodput_rps / other if other else float('inf'):>5.2f}x"
        print(row)
    verdict = levels[-1].goodput_rps >= 0.9 * peak
    print(
        f"goodput at {levels[-1].factor:g}x: {100 * levels[-1].goodput_rps / peak:.0f}% of the peak "
        f"({'meets' if verdict else 'misses'} the 90% target); errors other than 503: "
        f"{sum(level.other_errors for level in levels)}"
    )


def start_server(serve: str, port: int) -> subprocess.Popen:
    """`pagedserve serve` on 127.0.0.1; returns once it serves (GET /health answers 200)."""
    command = [
        sys.executable,
        "-m",
        "pagedserve",
        "serve",
        *shlex.split(serve),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-log-requests",
        "--uvicorn-log-level",
        "warning",
    ]
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"The server exited with {process.returncode}.")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise SystemExit("The server was not ready in 600 s.")


def ramp(
    base_url: str, pid: int | None, args: argparse.Namespace, capacity: float | None
) -> tuple[float, list]:
    model = served_model(base_url, args.model)
    capacity = capacity or args.capacity_rps or calibrate(base_url, model, args)
    probe = ServerProbe(base_url, pid)
    return capacity, [measure_level(factor, capacity, base_url, model, args, probe) for factor in args.levels]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", help="Start `pagedserve serve` with these arguments (model and flags).")
    parser.add_argument("--port", type=int, default=8011, help="Port of the server started with --serve.")
    parser.add_argument(
        "--base-url", default="http://127.0.0.1:8000", help="A running server (without --serve)."
    )
    parser.add_argument("--server-pid", type=int, help="Its process id, to measure RSS.")
    parser.add_argument("--peer-base-url", help="A second server to ramp the same way (goodput ratio).")
    parser.add_argument("--model", help="Model name in requests (default: the server's first model).")
    parser.add_argument("--levels", type=float, nargs="+", default=list(LEVELS), help="Load factors.")
    parser.add_argument("--level-duration", type=float, default=60.0, help="Seconds of arrivals per level.")
    parser.add_argument("--capacity-rps", type=float, help="Skip calibration: the capacity in requests/s.")
    parser.add_argument("--calibration-requests", type=int, default=64)
    parser.add_argument(
        "--calibration-concurrency",
        type=int,
        default=16,
        help="Requests in flight while calibrating: within the server's queue limits, so none is refused.",
    )
    parser.add_argument("--max-concurrency", type=int, help="Most requests in flight (default: no limit).")
    parser.add_argument(
        "--slo-ttft", type=float, default=10.0, help="Seconds: a slower first token is not goodput."
    )
    add_workload_args(parser, input_len=(64, 1024), output_len_max=256)
    parser.add_argument("--request-timeout", type=float, default=600.0, help="Client seconds per request.")
    args = parser.parse_args(argv)
    args.ignore_eos, args.text_prompts = True, False  # what serving.build_workload/run_workload read
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    process = start_server(args.serve, args.port) if args.serve else None
    base_url = f"http://127.0.0.1:{args.port}" if process else args.base_url
    try:
        capacity, levels = ramp(base_url, process.pid if process else args.server_pid, args, None)
        peer = ramp(args.peer_base_url, None, args, capacity)[1] if args.peer_base_url else None
    finally:
        if process is not None:
            process.terminate()
            process.wait(60)
    print_table(
        f"capacity {capacity:.2f} requests/s; input {args.input_len_min}-{args.input_len_max}, output "
        f"{args.output_len_min or args.output_len_max}-{args.output_len_max} tokens; "
        f"{args.level_duration:g} s per level; TTFT SLO {args.slo_ttft:g} s",
        levels,
        peer,
    )
    return 0 if all(level.other_errors == 0 for level in levels) else 1


if __name__ == "__main__":
    sys.exit(main())
