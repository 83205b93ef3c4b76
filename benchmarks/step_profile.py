"""Where one decode step's time goes: scheduler, input preparation, forward (per layer kind), logits,
sampler, scheduler update, output processing (detokenization), at the batch sizes asked.

The engine runs in this process (tp=1). Each phase is timed by wrapping the function that does it
(perf_counter around the call; CPU work is synchronous), the forward's layer kinds by forward hooks on
the leaf modules. The sum of the phases is checked against the measured step: what is left is the
untimed glue. Those wrappers cost time themselves (a few microseconds per call, and detokenization is
timed per request), so the steps are run twice: first with only the model's call
(`ModelRunner._run_model`) and the logits wrapped (one call each per step), which gives "outside the
forward and logits" and the uninstrumented step, then with every wrapper and hook, which gives the
breakdown. (Not a forward hook in the first run: hooks put `nn.Module.__call__` on its slow path, some
50 microseconds per step beside a CPU forward, which the engine never pays.) The steps run in inference
mode, as the loops that step the engine run them. "Outside the forward and logits" is the whole
`LLMEngine.step()` (the engine core's
schedule, the worker's diff update, batch and sampling-input build with its host-to-device copy, attention
metadata, sampler, the scheduler's update and stats; the frontend's output processing and
detokenization) minus the model's forward and `compute_logits_and_greedy` (the LM head, with the greedy
rows' argmax where its kernel folds it in); it is given in wall time and in this
thread's CPU time (which other processes on the cores do not inflate). The server adds two hops per
step (API server <-> engine process over ZMQ): with --serve it also measures the streamed inter-token
time of one request at a time and reports the difference.

    python benchmarks/step_profile.py --batch-sizes 1 32 --steps 32
    python benchmarks/step_profile.py --batch-sizes 1 32 --layers both   # torch vs fused layer kernels
    python benchmarks/step_profile.py --model PATH --dtype float32 --serve   # + the server's overhead
    python benchmarks/step_profile.py --batch-sizes 1 64 --steps 96 --host-only   # the host work alone
    python benchmarks/step_profile.py --batch-sizes 64 --host-only --stand-in sleep:30   # ... after idle cores
"""

import argparse
import collections
import contextlib
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from pagedserve import LLM, SamplingParams  # noqa: E402
from pagedserve.core.scheduler import Scheduler  # noqa: E402
from pagedserve.engine.detokenizer import IncrementalDetokenizer  # noqa: E402
from pagedserve.engine.output_processor import OutputProcessor  # noqa: E402
from pagedserve.kernels.cpu import fused_ops  # noqa: E402
from pagedserve.sampling_params import RequestOutputKind  # noqa: E402
from pagedserve.worker import model_runner as model_runner_module  # noqa: E402
from pagedserve.worker.input_batch import InputBatch  # noqa: E402

Timings = collections.defaultdict[str, float]
# The calling thread's CPU time of a phase (time.thread_time) is kept under this prefix: unlike the wall
# time it is not inflated by other processes competing for the cores (host work is this thread's alone).
CPU = "cpu: "


def timed(timings: Timings, phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            timings[phase] += time.perf_counter() - start
            timings[CPU + phase] += time.thread_time() - cpu_start

    return wrapper


@contextlib.contextmanager
def patched(owner: Any, name: str, timings: Timings, phase: str) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, timed(timings, phase, original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def hook_leaf_modules(model: torch.nn.Module, timings: Timings) -> list[Any]:
    """Time the whole forward, and every leaf module (linear layers, norms, rotary, attention, activation) by
    its class name."""
    handles, starts = [], {}
    for module in model.modules():
        if module is model:
            kind = "forward (all)"
        elif next(module.children(), None) is None:
            kind = "forward: " + type(module).__name__
        else:
            continue

        def before(mod: torch.nn.Module, _: Any) -> None:
            starts[id(mod)] = (time.perf_counter(), time.thread_time())

        def after(mod: torch.nn.Module, _: Any, __: Any, kind: str = kind) -> None:
            start, cpu_start = starts.pop(id(mod))
            timings[kind] += time.perf_counter() - start
            timings[CPU + kind] += time.thread_time() - cpu_start

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    return handles


class FixedModel(torch.nn.Module):
    """Stands in for the model with --host-only: a fixed hidden state per token and fixed random logits per
    row, with their argmax as the LM head gives it (the real head folds it into its matmul, and an
    accelerator's is device work), so a step is the engine's host work alone."""

    def __init__(self, model: Any, rows: int, max_tokens: int, stand_in: str = "none") -> None:
        """`stand_in`: what its forward does besides, in place of the real one's effect on the cores:
        "sleep:MS" (the cores idle), "stream:MB" (one thread reads that much memory), "none"."""
        super().__init__()
        self.config = model.config
        kind, _, amount = stand_in.partition(":")
        self.sleep_s = float(amount) / 1000 if kind == "sleep" else 0.0
        self.stream = torch.ones(int(float(amount) * 2**18) if kind == "stream" else 0)
        self.hidden = torch.zeros(max_tokens, model.config.hidden_size)
        self.logits = torch.randn(rows, model.config.vocab_size, generator=torch.Generator().manual_seed(0))
        self.tokens = self.logits.argmax(dim=1)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.stream.numel():
            self.stream.numpy().sum()
        return self.hidden[: input_ids.shape[0]]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits[: hidden.shape[0]]

    def compute_logits_and_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.logits[: hidden.shape[0]], self.tokens[: hidden.shape[0]]


def profile_decode(
    llm: LLM,
    batch_size: int,
    steps: int,
    prompt_len: int,
    host_only: bool = False,
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
    stand_in: str = "none",
) -> tuple[Timings, dict[str, float]]:
    """Bring `batch_size` requests past their prompt, then time `steps` pure decode steps twice (`host_only`:
    with the model replaced by `FixedModel`): uninstrumented but for the forward and the logits, then
    phase by phase. Returns the phases, whose "step" is the uninstrumented steps' time and "step
    (instrumented)" the others'. `output_kind`: final outputs only by default, what `LLM.generate` asks
    for; CUMULATIVE builds every request's output at every step, as a server's streams do."""
    engine = llm.llm_engine
    runner = engine.engine_core.executor.worker.model_runner
    model = runner.model
    if host_only:  # NOTE: from the prompts on: they need no forward either
        runner.model = FixedModel(model, batch_size, engine.config.scheduler.max_num_batched_tokens, stand_in)
    params = SamplingParams(
        temperature=0.0, max_tokens=2 * steps + 8, ignore_eos=True, output_kind=output_kind
    )
    for i in range(batch_size):
        engine.add_request(
            f"p{batch_size}-{time.perf_counter_ns()}-{i}",
            {"prompt_token_ids": [100 + (i + j) % 1000 for j in range(prompt_len)]},
            params,
        )
    while (
        any(len(r.output_token_ids) == 0 for r in engine.engine_core.scheduler.requests.values())
        or engine.engine_core.scheduler.waiting
    ):
        engine.step()
    for _ in range(3):  # warm up the decode shapes
        engine.step()
    timings: Timings = collections.defaultdict(float)
    with (
        patched(runner, "_run_model", timings, "forward (all)"),
        patched(runner.model, "compute_logits_and_greedy", timings, "logits"),
    ):
        timings["step"], timings[CPU + "step"] = timed_steps(engine, steps)
    outside = {key: timings.pop(key) for key in list(timings)}
    handles = hook_leaf_modules(runner.model, timings)
    with contextlib.ExitStack() as stack:
        for owner, name, phase in [
            (Scheduler, "schedule", "scheduler: schedule"),
            (Scheduler, "update_from_output", "scheduler: update"),
            (Scheduler, "get_stats", "scheduler: stats"),
            (InputBatch, "update", "input preparation"),
            (InputBatch, "build", "input preparation"),
            (runner.backend, "build_metadata", "input preparation"),
            (runner.model, "compute_logits_and_greedy", "logits"),
            (runner, "sampler", "sampler"),
            (runner.prompt_logprobs, "compute", "prompt logprobs"),
            (model_runner_module, "sample_step", "sampling (all)"),
            (OutputProcessor, "process_outputs", "output processing (all)"),
            (IncrementalDetokenizer, "update", "detokenization"),
            (IncrementalDetokenizer, "get_next_output_text", "detokenization"),
        ]:
            stack.enter_context(patched(owner, name, timings, phase))
        timings["step (instrumented)"], timings[CPU + "step (instrumented)"] = timed_steps(engine, steps)
    for handle in handles:
        handle.remove()
    runner.model = model
    while engine.has_unfinished_requests():
        engine.step()
    return timings, outside


@torch.inference_mode()
def timed_steps(engine: Any, steps: int) -> tuple[float, float]:
    """Wall and this thread's CPU time of `steps` engine steps, in inference mode as the loops that step
    the engine run them (LLM.generate's, the engine process's)."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        engine.step()
    return time.perf_counter() - start, time.thread_time() - cpu_start


def print_table(results: dict[str, tuple[Timings, dict[str, float]]], steps: int) -> None:
    """Two columns per run (batch size, and with --layers both: torch or fused layer kernels): wall time
    and this thread's CPU time. `results`: each run's phases and its uninstrumented steps."""
    columns = list(results)
    instrumented = "step (instrumented)"
    phases = sorted(
        {
            p
            for timings, _ in results.values()
            for p in timings
            if not p.startswith(CPU) and p != instrumented
        },
        key=lambda p: -results[columns[0]][0].get(p, 0.0),
    )
    # Each run's wall time beside its CPU time: on a loaded machine only the CPU time compares.
    headers = [column + kind for column in columns for kind in ("", " cpu")]
    print(f"\nms per decode step ({steps} steps)  " + "  ".join(f"{h:>18}" for h in headers))
    for phase, source in [*((p, 0) for p in phases), (instrumented, 0), ("step", 1)]:
        cells = [results[c][source].get(prefix + phase, 0.0) for c in columns for prefix in ("", CPU)]
        label = "step (uninstrumented)" if source else phase
        print(f"{label:<32}" + "  ".join(f"{v / steps * 1e3:>18.3f}" for v in cells))
    for column in columns:
        timings, clean = results[column]
        outside = clean["step"] - clean["forward (all)"] - clean["logits"]
        outside_cpu = clean[CPU + "step"] - clean[CPU + "forward (all)"] - clean[CPU + "logits"]
        forward = timings["forward (all)"]
        print(
            f"{column}: outside the forward and logits {outside / steps * 1e3:.2f} ms per step "
            f"({outside / clean['step']:.0%}; its CPU time {outside_cpu / steps * 1e3:.2f} ms), uninstrumented; "
            f"leaf modules cover "
            f"{sum(v for k, v in timings.items() if k.startswith('forward: ')) / forward:.0%} of the forward"
        )


def use_layer_kernels(kind: str) -> None:
    """Switch the layers (RMSNorm, rotary, gated activations) between torch ops and the fused native
    kernels for the runs that follow (the attention and GGUF kernels stay native either way)."""
    os.environ["PAGEDSERVE_FUSED_CPU_OPS"] = "1" if kind == "fused" else "0"
    fused_ops._ops.cache_clear()


def server_tpot(model_args: list[str], tokens: int) -> float:
    """Median streamed inter-token time of one request at a time through a real server."""
    import subprocess

    import httpx
    from openai import OpenAI

    port = 8123
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pagedserve",
            "serve",
            *model_args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while not _answers(httpx, base + "/ready"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not become ready (exit status {server.poll()})")
            time.sleep(0.5)
        client = OpenAI(base_url=base + "/v1", api_key="none")
        gaps = []
        for _ in range(3):
            stamps = []
            stream = client.completions.create(
                model=client.models.list().data[0].id,
                prompt="Hello",
                max_tokens=tokens,
                stream=True,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            for _chunk in stream:
                stamps.append(time.perf_counter())
            gaps += [b - a for a, b in zip(stamps[1:], stamps[2:])]
        return statistics.median(gaps)
    finally:
        server.terminate()
        server.wait(60)


def _answers(httpx: Any, url: str) -> bool:
    try:
        return bool(httpx.get(url, timeout=5).status_code == 200)
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument(
        "--layers",
        choices=["fused", "torch", "both"],
        default="fused",
        help="layer kernels (RMSNorm, rotary, SiLU/GELU·mul): native fused (default), torch ops, or both "
        "side by side in one run (the attention and GGUF kernels are native in all)",
    )
    parser.add_argument("--serve", action="store_true", help="also measure the server's inter-token time")
    parser.add_argument(
        "--host-only",
        action="store_true",
        help="replace the model's forward and logits by fixed tensors once the prompts are in: the step's "
        "host work alone, in seconds rather than minutes on a machine that other jobs load",
    )
    parser.add_argument(
        "--stand-in",
        default="none",
        help="with --host-only, what the fixed forward does besides: sleep:MS (the cores idle that long) or "
        "stream:MB (one thread reads that much memory), so the host work runs after the cores did "
        "something else, as beside a real forward; its time is the forward's",
    )
    parser.add_argument(
        "--cumulative-outputs",
        action="store_true",
        help="every request's cumulative output at every step (LLMEngine.step's default; a server's "
        "streams build one per step too) instead of final outputs only, as LLM.generate asks",
    )
    args = parser.parse_args()
    output_kind = RequestOutputKind.CUMULATIVE if args.cumulative_outputs else RequestOutputKind.FINAL_ONLY
    llm = LLM(
        args.model,
        dtype=args.dtype,
        # NOTE: 64 requests of 64 + 2 x 96 + 8 tokens fit SmolLM2's float32 cache (45 KiB a token) whole:
        # a preemption would be timed as step overhead. 2048 tokens fit for a 1B-class model too.
        kv_cache_memory=2**30,
        max_model_len=2048,
        enable_prefix_caching=False,
        distributed_executor_backend="uni",
    )
    results = {}
    for b in args.batch_sizes:
        for kind in ("torch", "fused") if args.layers == "both" else (args.layers,):
            use_layer_kernels(kind)
            results[f"batch {b} {kind}"] = profile_decode(
                llm, b, args.steps, args.prompt_len, args.host_only, output_kind, args.stand_in
            )
    print_table(results, args.steps)
    if args.serve:
        model_args = ([args.model] if args.model else []) + [
            "--dtype",
            args.dtype,
            "--kv-cache-memory",
            "512MiB",
            "--no-enable-prefix-caching",
        ]
        tpot = server_tpot(model_args, args.steps)
        batch_one = [clean["step"] for column, (_, clean) in results.items() if column.startswith("batch 1 ")]
        offline = batch_one[-1] / args.steps if batch_one else float("nan")
        print(
            f"server, one request: {tpot * 1e3:.2f} ms per token; offline batch-1 step "
            f"{offline * 1e3:.2f} ms: server + IPC overhead {(tpot - offline) * 1e3:.2f} ms per token"
        )


if __name__ == "__main__":
    main()
