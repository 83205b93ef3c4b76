"""Constraint state follows a request through recompute and swap preemption (a tiny KV pool), chunked
prefill and prefix-cache hits: the same tokens as an unhindered run, every one allowed by the grammar."""

import json
import random

import llguidance
import pytest

from pagedserve import LLM, SamplingParams
from pagedserve.outputs import RequestOutput
from pagedserve.structured_output.grammar import make_ll_tokenizer, to_grammar
from pagedserve.structured_outputs_params import StructuredOutputsParams

TINY = dict(block_size=8, max_model_len=64, num_gpu_blocks_override=12)  # 11 usable blocks
SCHEMA = {
    "type": "object",
    "properties": {
        "word": {"type": "string", "maxLength": 40},
        "n": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["word", "n"],
}
CONSTRAINT = StructuredOutputsParams(json=SCHEMA)


def prompts(num: int, length: int = 10) -> list[list[int]]:
    rng = random.Random(num)
    return [[rng.randrange(3, 49152) for _ in range(length)] for _ in range(num)]


def run(llm: LLM, prompt_ids: list[list[int]], params: SamplingParams) -> tuple[list[list[list[int]]], int]:
    """Every sample's token ids per prompt, and the engine's preemptions meanwhile."""
    engine = llm.llm_engine
    before = engine.engine_core.get_stats().num_preemptions_total
    for index, prompt in enumerate(prompt_ids):
        engine.add_request(f"p{index}", {"prompt_token_ids": prompt}, params)
    finished: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    preemptions = engine.engine_core.get_stats().num_preemptions_total - before
    return [[o.token_ids for o in finished[f"p{i}"].outputs] for i in range(len(prompt_ids))], preemptions


def assert_grammar_allows(llm: LLM, token_ids: list[int]) -> None:
    """Replay the tokens through a fresh matcher: the grammar allowed every one of them."""
    tokenizer = make_ll_tokenizer(llm.get_tokenizer(), 49152)
    matcher = llguidance.LLMatcher(tokenizer, to_grammar(CONSTRAINT))
    assert matcher.consume_tokens(token_ids), matcher.get_error()


@pytest.fixture(scope="module")
def roomy(tiny_llama: str) -> LLM:
    return LLM(tiny_llama, block_size=8, max_model_len=64, kv_cache_memory="8MiB")


@pytest.mark.sampled
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_the_constraint_state(roomy: LLM, tiny_llama: str, mode: str) -> None:
    tiny = LLM(tiny_llama, preemption_mode=mode, swap_space=0.01, **TINY)
    prompt_ids = prompts(3)
    params = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=40, structured_outputs=CONSTRAINT)
    expected, _ = run(roomy, prompt_ids, params)
    ours, preemptions = run(tiny, prompt_ids, params)
    assert preemptions > 0, "the tiny pool must preempt"
    assert ours == expected
    for samples in ours:
        for token_ids in samples:
            assert_grammar_allows(tiny, token_ids)


def test_chunked_prefill_and_prefix_cache_hits_keep_the_output(roomy: LLM, tiny_llama: str) -> None:
    chunked = LLM(
        tiny_llama, block_size=8, max_model_len=64, kv_cache_memory="8MiB", max_num_batched_tokens=8
    )
    prompt_ids = prompts(2, length=30)
    params = SamplingParams(temperature=0.0, max_tokens=30, structured_outputs=CONSTRAINT)
    expected, _ = run(roomy, prompt_ids, params)
    cached_before = roomy.llm_engine.engine_core.get_stats().prefix_cache_hits
    again, _ = run(roomy, prompt_ids, params)  # the same prompts: prefix-cache hits this time
    assert roomy.llm_engine.engine_core.get_stats().prefix_cache_hits > cached_before
    chunks, _ = run(chunked, prompt_ids, params)
    assert again == expected and chunks == expected
    for samples in expected:
        assert_grammar_allows(roomy, samples[0])
        text = roomy.get_tokenizer().decode(samples[0], skip_special_tokens=True)
        if len(samples[0]) < 30:  # finished by the grammar, not cut by max_tokens: whole JSON
            assert set(json.loads(text)) == {"word", "n"}
