"""Sliding-window KV: blocks out of every layer group's reach go back to the pool as a request grows,
outputs stay HF's, prefix caching stays correct, and nothing leaks."""

import random

import pytest

from pagedserve import LLM, SamplingParams
from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.engine.core import EngineCore
from pagedserve.utils import cdiv

WINDOW = 24  # tests/conftest.py: mistral-swa and gemma2's local layers
CHUNK = 16  # max_num_batched_tokens: long prompts are chunked


def drive(llm: LLM, prompt: list[int], max_tokens: int) -> tuple[list[int], list[int], list[int]]:
    """Run one request step by step: (its tokens, blocks held after each prefill step, after each decode)."""
    engine = llm.llm_engine
    block_size = engine.engine_core.block_snapshot().block_size
    engine.add_request(
        "long",
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
    )
    prefill, decode, tokens = [], [], []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        # NOTE: the only request: the stats' slots (freed window entries not counted) are its blocks.
        held = engine.engine_core.get_stats().num_kv_slots_allocated // block_size
        (decode if tokens else prefill).append(held)
        if outputs:
            tokens = list(outputs[0].outputs[0].token_ids)
    return tokens, prefill, decode


def all_blocks_free(core: EngineCore) -> bool:
    blocks = core.block_snapshot()
    return blocks.num_free_blocks == blocks.num_blocks and not blocks.request_ids


@pytest.mark.sampled
@pytest.mark.parametrize("block_size", [8, 32])
def test_long_request_holds_only_its_window(tiny_model_factory, block_size: int) -> None:
    llm = LLM(
        tiny_model_factory("mistral-swa"),
        block_size=block_size,
        kv_cache_memory="16MiB",
        max_num_batched_tokens=CHUNK,
    )
    core = llm.llm_engine.engine_core
    prompt = [random.Random(block_size).randrange(3, 49152) for _ in range(70)]
    tokens, prefill, decode = drive(llm, prompt, max_tokens=90)
    bound = cdiv(WINDOW, block_size) + 1
    assert decode and max(decode[:-1]) <= bound  # the last step finished the request: it holds nothing
    groups = KVCacheGroups.from_layer_windows([WINDOW, WINDOW], block_size)
    assert max(prefill) <= groups.max_blocks(160, CHUNK)
    assert cdiv(160, block_size) > bound, "the request must outgrow its window"
    assert all_blocks_free(core)
    # The same prompt again (its prefix blocks partly evicted, partly revived): the same tokens.
    again, _, _ = drive(llm, prompt, max_tokens=90)
    assert again == tokens
    assert all_blocks_free(core)


@pytest.mark.sampled
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_window_groups_free_while_the_global_group_keeps_every_block(
    tiny_model_factory, block_size: int
) -> None:
    """Gemma 2 mixes local and global layers: each group has its own table; the global group holds every
    block, the window group at most ceil(W / block_size) + 1 while decoding (and its freed blocks are real
    memory: a block id spans one layer of each group's place)."""
    llm = LLM(
        tiny_model_factory("gemma2"),
        block_size=block_size,
        kv_cache_memory="16MiB",
        max_num_batched_tokens=CHUNK,
    )
    engine = llm.llm_engine
    prompt = [random.Random(1).randrange(3, 49152) for _ in range(70)]
    engine.add_request(
        "long", {"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=90, ignore_eos=True)
    )
    bound = cdiv(WINDOW, block_size) + 1
    decoding: list[tuple[int, list[int]]] = []
    while engine.has_unfinished_requests():
        engine.step()
        usage = engine.engine_core.request_kv_usage("long")
        if usage is not None and usage.num_computed_tokens > len(prompt):
            decoding.append((usage.num_computed_tokens, usage.blocks_per_group))
    assert decoding and cdiv(160, block_size) > bound, "the request must outgrow its window"
    for computed, groups in decoding:
        full, window = groups  # two groups: the global layers first, then the local (windowed) ones
        assert full == cdiv(computed + 1, block_size) or full == cdiv(computed, block_size)
        assert window <= bound
    assert all_blocks_free(engine.engine_core)  # all returned


@pytest.mark.sampled
@pytest.mark.parametrize("name", ["mistral-swa", "gemma2"])
def test_swap_preemption_with_freed_blocks_keeps_outputs(tiny_model_factory, name: str) -> None:
    """Requests whose tables hold freed (null) entries swap out and back in: the same tokens as with room
    (Gemma 2: two KV cache groups, the window group's entries freed, the full group's all kept)."""
    path = tiny_model_factory(name)
    rng = random.Random(2)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 49152) for _ in range(n)]} for n in (60, 45, 70, 30)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    outputs = {}
    # Gemma 2: a block per group, and its full group holds a whole request (110 tokens, < 128).
    tight = (
        dict(num_gpu_blocks_override=12)
        if name == "mistral-swa"
        else dict(num_gpu_blocks_override=24, max_model_len=128)
    )
    for run, pool in (("roomy", dict(kv_cache_memory="16MiB")), ("tight", tight)):
        llm = LLM(
            path, block_size=8, max_num_batched_tokens=CHUNK, preemption_mode="swap", swap_space=0.01, **pool
        )
        outputs[run] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        if run == "tight":
            assert llm.llm_engine.engine_core.get_stats().num_preemptions_total > 0, (
                "the pool was meant to force swapping"
            )
    assert outputs["tight"] == outputs["roomy"]


def test_a_beam_search_longer_than_the_pool_fits_in_its_windows(tiny_model_factory) -> None:
    """The beam-width check counts what each beam holds at most (its window), as the KV manager frees it:
    a search whose beams would need more blocks than the pool if they kept every block is accepted and
    runs to its end, while one that cannot fit even in its windows is refused with the numbers."""
    from pagedserve.errors import InvalidRequestError
    from pagedserve.sampling_params import BeamSearchParams

    block_size = 8
    llm = LLM(
        tiny_model_factory("mistral-swa"),
        block_size=block_size,
        num_gpu_blocks_override=25,  # 24 usable blocks
        max_num_batched_tokens=CHUNK,
        max_model_len=512,
    )
    layout = llm.llm_engine.config.kv_layout
    prompt = [random.Random(7).randrange(3, 49152) for _ in range(40)]
    params = BeamSearchParams(beam_width=2, max_tokens=120, ignore_eos=True)
    assert 2 * cdiv(40 + 120, block_size) > 24, "unwindowed, the beams would need more than the pool"
    assert 2 * layout.max_blocks(40 + 120) <= 24
    (output,) = llm.beam_search([{"prompt_token_ids": prompt}], params)
    assert len(output.sequences[0].tokens) == 40 + 120
    assert all_blocks_free(llm.llm_engine.engine_core)
    with pytest.raises(InvalidRequestError, match="may need .* KV blocks; the KV cache has 24"):
        llm.beam_search([{"prompt_token_ids": prompt}], BeamSearchParams(beam_width=12, max_tokens=120))
