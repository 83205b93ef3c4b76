"""Structured outputs: output tok/s with and without a JSON-schema constraint, at concurrency 1 and 16,
and grammar compile time (cold, cached). Target: constrained >= 90% of unconstrained.

Both runs generate exactly --output-len tokens per request: the unconstrained one with ignore_eos, the
constrained one under a schema (an array of at least --output-len digits) that cannot end sooner, so they
do the same work plus the masks. "Steps during compile" counts the steps the engine ran for other
requests while a new grammar compiled in the background (the step never waits on a compile).

    python benchmarks/structured.py --output-len 64
"""

import argparse
import os
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


def compile_times(engine: LLMEngine, output_len: int) -> tuple[float, float, int]:
    """Cold and cached compile seconds of a new schema, and the steps that other requests ran meanwhile."""
    manager = engine.engine_core.structured_output
    background = SamplingParams(temperature=0.0, max_tokens=10 * output_len, ignore_eos=True)
    engine.add_request("background", PROMPT, background)
    engine.step()
    schema = StructuredOutputsParams(json=digits_schema(output_len, salt=1))
    start = time.perf_counter()
    grammar = manager.grammar_for(schema)
    steps = 0
    while not grammar.ready():
        engine.step()
        steps += 1
    cold = time.perf_counter() - start
    start = time.perf_counter()
    assert manager.grammar_for(schema).ready()
    cached = time.perf_counter() - start
    engine.abort_request("background")
    return cold, cached, steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    engine = LLMEngine(EngineArgs.from_kwargs(model=args.model, max_model_len=1024, kv_cache_memory="256MiB"))
    plain = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    constrained = SamplingParams(
        temperature=0.0,
        max_tokens=args.output_len,
        structured_outputs=StructuredOutputsParams(json=digits_schema(args.output_len)),
    )
    run(engine, 1, constrained, "warmup")  # the tokenizer build and the first compile are not throughput
    print(f"output tok/s, {args.output_len} tokens per request (measured under load on this CPU)")
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
    cold, cached, steps = compile_times(engine, args.output_len)
    print(
        f"compile: cold {cold * 1e3:.1f} ms ({steps} steps of another request ran meanwhile), "
        f"cached {cached * 1e6:.0f} µs"
    )


if __name__ == "__main__":
    main()
