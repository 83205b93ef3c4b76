"""Swap preemption, forced by a tiny KV pool: outputs equal to an unconstrained run, groups of parallel
samples and beams swap out whole and come back, and nothing leaks in either pool (on CPU the host pool
is a second tensor pool)."""

import random

import pytest

from pagedserve import LLM, BeamSearchParams, SamplingParams
from pagedserve.outputs import RequestOutput

TINY = dict(block_size=8, max_model_len=64, num_gpu_blocks_override=12)  # 11 usable blocks


def make_prompts(num: int, length: int = 10) -> list[list[int]]:
    rng = random.Random(num)
    return [[rng.randrange(3, 49152) for _ in range(length)] for _ in range(num)]


def run(
    llm: LLM, prompts: list[list[int]], params: SamplingParams, beam_search: BeamSearchParams | None = None
) -> tuple[list[list[list[int]]], int, int | None]:
    """Every output's token ids per prompt, the most requests swapped out at once and the fewest free
    host blocks at any step (None without a swap space)."""
    engine = llm.llm_engine
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, params, beam_search=beam_search)
    finished: dict[str, RequestOutput] = {}
    core = engine.engine_core
    most_swapped, num_host_blocks = 0, core.block_snapshot().num_host_blocks
    lowest_free = num_host_blocks or None
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
        most_swapped = max(most_swapped, core.get_stats().num_swapped_reqs)
        if lowest_free is not None:
            lowest_free = min(lowest_free, core.block_snapshot().num_free_host_blocks)
    outputs = [[o.token_ids for o in finished[str(i)].outputs] for i in range(len(prompts))]
    return outputs, most_swapped, lowest_free


def assert_no_leaks(llm: LLM) -> None:
    core = llm.llm_engine.engine_core
    blocks = core.block_snapshot()
    assert not core.has_unfinished_requests() and not blocks.request_ids
    assert blocks.num_free_blocks == blocks.num_blocks and core.get_stats().kv_cache_usage == 0.0
    assert blocks.num_host_blocks and blocks.num_free_host_blocks == blocks.num_host_blocks


@pytest.fixture(scope="module")
def roomy(tiny_llama: str) -> LLM:
    return LLM(tiny_llama, block_size=8, max_model_len=64, kv_cache_memory="8MiB")


@pytest.fixture(scope="module")
def tiny(tiny_llama: str) -> LLM:
    return LLM(tiny_llama, swap_space=0.01, **TINY)


def test_parallel_samples_swap_as_a_group(roomy: LLM, tiny: LLM) -> None:
    prompts = make_prompts(2)
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=20, ignore_eos=True)
    expected, *_ = run(roomy, prompts, params)
    ours, most_swapped, _ = run(tiny, prompts, params)
    assert most_swapped == 2, "the newer group (both samples) was swapped out"
    assert ours == expected
    assert_no_leaks(tiny)


def test_beams_swap_as_a_group(roomy: LLM, tiny: LLM) -> None:
    prompts = make_prompts(2, 11)
    params = SamplingParams(n=2, temperature=0.0, max_tokens=16)
    beam_search = BeamSearchParams(beam_width=2, max_tokens=16, ignore_eos=True)
    expected, *_ = run(roomy, prompts, params, beam_search)
    ours, most_swapped, _ = run(tiny, prompts, params, beam_search)
    assert most_swapped == 2 and ours == expected
    assert_no_leaks(tiny)


def test_single_requests_swap_in_swap_mode(tiny_llama: str, roomy: LLM) -> None:
    llm = LLM(tiny_llama, swap_space=0.01, preemption_mode="swap", **TINY)
    prompts = make_prompts(4, 20)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    expected, *_ = run(roomy, prompts, params)
    ours, most_swapped, _ = run(llm, prompts, params)
    assert most_swapped > 0 and ours == expected
    assert_no_leaks(llm)


def test_a_full_host_pool_uses_exactly_its_rows(tiny_llama: str, roomy: LLM) -> None:
    """A host pool of 3 blocks that a preempted request fills exactly: swap-out writes host rows 0..2,
    never row 3 (which does not exist)."""
    bytes_per_block = roomy.llm_engine.engine_core.kv_cache_config.bytes_per_block  # same block size
    llm = LLM(tiny_llama, swap_space=3 * bytes_per_block / 2**30, preemption_mode="swap", **TINY)
    assert llm.llm_engine.engine_core.block_snapshot().num_host_blocks == 3
    prompts = make_prompts(4, 20)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    expected, *_ = run(roomy, prompts, params)
    ours, most_swapped, lowest_free = run(llm, prompts, params)
    assert most_swapped > 0 and lowest_free == 0, "the host pool was filled exactly"
    assert ours == expected
    assert_no_leaks(llm)
