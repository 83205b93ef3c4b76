"""Automatic prefix caching end to end: greedy tokens identical with caching on and off, across block
sizes and every alignment of the shared prefix; tenants (cache_salt); reset; statistics; prompt
logprobs unaffected."""

import random

import pytest

from pagedserve import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def shared_prefix_prompts(block_size: int) -> list[list[int]]:
    """Prompts that share prefixes ending mid-block, exactly at a block end, and whole prompts."""
    rng = random.Random(block_size)
    tokens = [rng.randrange(3, 49152) for _ in range(4 * block_size)]

    def tail(n: int) -> list[int]:
        return [rng.randrange(3, 49152) for _ in range(n)]

    return [
        tokens[: 3 * block_size + 3],  # the first request: later ones hit its blocks
        tokens[: 2 * block_size + 3] + tail(5),  # shares 2 blocks + 3 tokens: ends mid-block
        tokens[: 2 * block_size] + tail(block_size),  # shares exactly 2 blocks
        tokens[: 2 * block_size + 1],  # all but its last token cached
        tokens[: 3 * block_size + 3],  # the whole prompt again
        tokens[:block_size] + tail(1),
    ]


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def stats(llm: LLM):
    return llm.llm_engine.engine_core.get_stats()


@pytest.mark.sampled
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_greedy_identical_with_prefix_caching_on_and_off(tiny_llama: str, block_size: int) -> None:
    prompts = shared_prefix_prompts(block_size)
    results = {}
    for caching in (True, False):
        llm = LLM(tiny_llama, block_size=block_size, kv_cache_memory="8MiB", enable_prefix_caching=caching)
        together = generate(llm, prompts)  # admitted in one step: hits on blocks computed in the same step
        one_by_one = [generate(llm, [p])[0] for p in prompts]  # hits on freed, revivable blocks
        results[caching] = (together, one_by_one, stats(llm))
    assert results[True][0] == results[False][0] == results[True][1] == results[False][1]
    on, off = results[True][2], results[False][2]
    assert on.prefix_cache_hits > 0 and on.prefix_cache_queries > on.prefix_cache_hits
    assert off.prefix_cache_queries == off.prefix_cache_hits == 0


@pytest.fixture(scope="module")
def llm(tiny_llama: str) -> LLM:
    return LLM(tiny_llama, block_size=8, kv_cache_memory="8MiB")


def test_cache_salt_separates_tenants(llm: LLM) -> None:
    """Hits only within a salt; each request's `num_cached_tokens` (vLLM's) is the hit the engine counted."""
    prompt = list(range(1000, 1033))

    def hits_of(salt: str | None) -> int:
        before = stats(llm).prefix_cache_hits
        (output,) = llm.generate(
            [{"prompt_token_ids": prompt, **({"cache_salt": salt} if salt else {})}], GREEDY, use_tqdm=False
        )
        hits = stats(llm).prefix_cache_hits - before
        assert output.num_cached_tokens == hits
        return hits

    assert hits_of("tenant-a") == 0
    assert hits_of("tenant-b") == 0 and hits_of(None) == 0
    assert hits_of("tenant-a") == 32 and hits_of(None) == 32


def test_reset_prefix_cache(llm: LLM) -> None:
    prompt = list(range(2000, 2020))
    first = generate(llm, [prompt])
    assert llm.reset_prefix_cache()
    before = stats(llm).prefix_cache_hits
    assert generate(llm, [prompt]) == first and stats(llm).prefix_cache_hits == before


def test_prompt_logprobs_are_computed_whole_despite_a_cached_prefix(llm: LLM) -> None:
    prompt = list(range(3000, 3021))
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    first = llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    again = llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    assert len(first) == len(again) == len(prompt)
    for a, b in zip(first[1:], again[1:]):
        assert a.keys() == b.keys() and all(a[k].logprob == pytest.approx(b[k].logprob, abs=1e-5) for k in a)
