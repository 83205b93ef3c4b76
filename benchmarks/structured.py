"""Structured outputs: output tok/s with and without a JSON-schema constraint, at concurrency 1 and 16,
and grammar compile time (cold, cached). Target: constrained >= 90% of unconstrained.

Both runs generate exactly --output-len tokens per request: the unconstrained one with ignore_eos, the
constrained one under a schema (an array of at least --output-len digits) that cannot end sooner, so they
do the same work plus the masks. The compile line counts the steps the engine ran for another request
while a new grammar compiled in the background, and compares the slowest of them with that request's
median step before: close figures mean no step waited on the compile.

    python benchmarks/structured.py --output-len 64
    python benchmarks/structured.py --short     # a quick check that it runs: 16 tokens, concurrency 1 and 4
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pagedserve.config import EngineArgs  # noqa: E402
from pagedserve.engine.llm_engine import LLMEngine  # noqa: E402
from pagedserve.sampling_params import SamplingParams  # noqa: E402
from pagedserve.structured_outputs_params import StructuredOutputsParams  # noqa: E402

PROMPT = "List some digits as a JSON array:"


def digits_schema(min_items: int, salt: int = 0) -> dict:
    """No shorter document is valid: the run lasts --output-len tokens. `salt` makes a new cache key."""
    return {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9 + salt},
        "minItems": min_items,
    }


def run(engine: LLMEngine, concurrency: int, params: SamplingParams, tag: str) -> tuple[float, float]:
    """(output tok/s, slowest step in s) for `concurrency` requests run together to the end."""
    for i in range(concurrency):
        engine.add_request(f"{tag}-{i}", PROMPT, params)
    tokens, slowest, start = 0, 0.0, time.perf_counter()
    while engine.has_unfinished_requests():
        step_start = time.perf_counter()
        outputs = engine.step()
        slowest = max(slowest, time.perf_counter() - step_start)
        tokens += sum(len(o.outputs[0].token_ids) for o in outputs if o.finished)
    return tokens / (time.perf_counter() - start), slowest


def wide_schema(salt: int) -> dict:
    """A schema that takes llguidance longer than a decode step to compile (many typed, bounded fields);
    `salt` makes a new cache key, so the first compile is cold."""
    fields = {
        f"field{i}": [
            {"type": "string", "pattern": f"^[a-z]{{1,{i % 7 + 2}}}-[0-9]{{{i % 5 + 1}}}$"},
            {"type": "integer", "minimum": -i, "maximum": 1000 + i + salt},
            {"enum": [f"v{i}-{j}" for j in range(6)]},
            {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": i + 1}, "maxItems": 4},
        ][i % 4]
        for i in range(120)
    }
    return {"type": "object", "properties": fields, "required": list(fields)}


def compile_times(engine: LLMEngine) -> tuple[float, float, int, float, float]:
    """A new schema's cold and cached compile seconds, the steps another request ran meanwhile, and that
    request's slowest step during the compile against its median step before (no step waits on it)."""
    manager = engine.engine_core.structured_output
    background = SamplingParams(temperature=0.0, max_tokens=512, ignore_eos=True)  # outlasts the compile
    engine.add_request("background", PROMPT, background)
    engine.step()  # its prefill
    before = []
    for _ in range(8):
        start = time.perf_counter()
        engine.step()
        before.append(time.perf_counter() - start)
    schema = StructuredOutputsParams(json=wide_schema(salt=1))
    start = time.perf_counter()
    grammar = manager.grammar_for(schema)
    during = []
    while not grammar.ready():
        step_start = time.perf_counter()
        engine.step()
        during.append(time.perf_counter() - step_start)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    assert manager.grammar_for(schema).ready()
    cached = time.perf_counter() - start
    engine.abort_request("background")
    return cold, cached, len(during), max(during, default=0.0), statistics.median(before)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--short", action="store_true", help="16 tokens at concurrency 1 and 4 (smoke run)")
    args = parser.parse_args()
    if args.short:
        args.output_len, args.concurrency = 16, [1, 4]
    engine = LLMEngine(EngineArgs.from_kwargs(model=args.model, max_model_len=1024, kv_cache_memory="256MiB"))
    plain = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    constrained = SamplingParams(
        temperature=0.0,
        max_tokens=args.output_len,
        structured_outputs=StructuredOutputsParams(json=digits_schema(args.output_len)),
    )
    run(engine, 1, constrained, "warmup")  # the tokenizer build and the first compile are not throughput
    print(f"output tok/s, {args.output_len} tokens per request")
    print(
        f"{'concurrency':>11} {'unconstrained':>14} {'json schema':>12} {'ratio':>6} "
        f"{'slowest step plain/json (ms)':>29}"
    )
    for concurrency in args.concurrency:
        plain_rate, plain_slowest = run(engine, concurrency, plain, f"plain{concurrency}")
        json_rate, json_slowest = run(engine, concurrency, constrained, f"json{concurrency}")
        print(
            f"{concurrency:>11} {plain_rate:>14.1f} {json_rate:>12.1f} {json_rate / plain_rate:>6.2f} "
            f"{plain_slowest * 1e3:>14.0f} / {json_slowest * 1e3:<12.0f}"
        )
    cold, cached, steps, slowest_during, median_before = compile_times(engine)
    print(
        f"compile of a 120-field schema: cold {cold * 1e3:.1f} ms, cached {cached * 1e6:.0f} µs; "
        f"another request ran {steps} steps meanwhile, slowest {slowest_during * 1e3:.0f} ms "
        f"(its median step before: {median_before * 1e3:.0f} ms)"
    )


if __name__ == "__main__":
    main()
