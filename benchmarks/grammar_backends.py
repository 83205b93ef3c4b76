"""xgrammar vs llguidance on this CPU, at SmolLM2's vocabulary (49152 tokens): how long a JSON schema
takes to compile (cold, and again from each engine's cache), and how long one next-token mask takes while
a matcher walks a valid document token by token. pagedserve keeps llguidance (see docs/benchmarks.md,
"Grammar engine"); this script is the measurement behind that choice.

    python benchmarks/grammar_backends.py            # needs `pip install xgrammar llguidance`
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
        },
    },
    "required": ["name", "age", "email", "tags", "address"],
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.com",
    "tags": ["a", "c"],
    "address": {"city": "London", "zip": "W1"},
}


def measure_llguidance(tokenizer, tokens: list[int]) -> tuple[float, float, float]:
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False})
    template = llguidance.LLMatcher(ll_tokenizer, grammar)
    bitmask = llguidance.numpy.allocate_token_bitmask(1, ll_tokenizer.vocab_size)
    llguidance.numpy.fill_next_token_bitmask(template, bitmask)  # the lexer is built lazily: count it
    cold = time.perf_counter() - start
    start = time.perf_counter()
    matcher = template.deep_copy()  # pagedserve's cache: a fresh compiled matcher, copied per request
    cached = time.perf_counter() - start
    times = []
    for token in tokens:
        start = time.perf_counter()
        llguidance.numpy.fill_next_token_bitmask(matcher, bitmask)
        times.append(time.perf_counter() - start)
        assert matcher.consume_token(token), matcher.get_error()
    return cold, cached, statistics.median(times)


def measure_xgrammar(tokenizer, tokens: list[int]) -> tuple[float, float, float]:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=True)
    text = json.dumps(SCHEMA)
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(text, any_whitespace=False, separators=(",", ":"))
    cold = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(text, any_whitespace=False, separators=(",", ":"))
    cached = time.perf_counter() - start
    matcher = xgrammar.GrammarMatcher(compiled)
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for token in tokens:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        times.append(time.perf_counter() - start)
        assert matcher.accept_token(token)
    return cold, cached, statistics.median(times)


def main() -> None:
    from pagedserve.config import EngineArgs
    from pagedserve.engine.tokenizer import load_tokenizer

    config = EngineArgs.from_kwargs(model=None).create_engine_config()
    tokenizer = load_tokenizer(config.model)
    tokens = tokenizer.encode(json.dumps(DOCUMENT, separators=(",", ":")))
    print(f"vocab {len(tokenizer)}, document of {len(tokens)} tokens")
    print(
        f"{'engine':<12} {'compile cold ms':>16} {'compile cached ms':>18} {'mask per token µs (median)':>27}"
    )
    for name, measure in (("llguidance", measure_llguidance), ("xgrammar", measure_xgrammar)):
        cold, cached, mask = measure(tokenizer, tokens)
        print(f"{name:<12} {cold * 1e3:>16.2f} {cached * 1e3:>18.3f} {mask * 1e6:>27.1f}")


if __name__ == "__main__":
    main()
