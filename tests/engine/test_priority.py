"""Priority scheduling offline: `LLM(scheduling_policy="priority").generate(..., priority=[...])` serves
lower values first, gives every request the tokens it gets alone, and refuses what it cannot honour."""

import pytest

from pagedserve import LLM, SamplingParams
from pagedserve.errors import ConfigError, InvalidRequestError

PROMPTS = [{"prompt_token_ids": [5 + i, 6, 7, 8, 9 + i]} for i in range(4)]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def finish_order(llm: LLM, priorities: list[int]) -> list[str]:
    engine = llm.llm_engine
    for i, (prompt, priority) in enumerate(zip(PROMPTS, priorities)):
        engine.add_request(f"r{i}", prompt, PARAMS, priority=priority)
    order = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.finished]
    return order


def test_lower_values_first_and_the_same_tokens(tiny_llama: str) -> None:
    alone = LLM(tiny_llama, max_num_seqs=1, kv_cache_memory="4MiB")
    expected = [o.outputs[0].token_ids for o in alone.generate(PROMPTS, PARAMS, use_tqdm=False)]
    with pytest.raises(InvalidRequestError, match="--scheduling-policy priority"):
        alone.generate(PROMPTS[0], PARAMS, priority=[1], use_tqdm=False)
    del alone
    llm = LLM(tiny_llama, max_num_seqs=1, kv_cache_memory="4MiB", scheduling_policy="priority")
    assert finish_order(llm, [3, 0, 2, 1]) == ["r1", "r3", "r2", "r0"]
    outputs = llm.generate(PROMPTS, PARAMS, priority=[3, 0, 2, 1], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected  # outputs in input order
    with pytest.raises(InvalidRequestError, match="2 prompts but 1 priority"):
        llm.generate(PROMPTS[:2], PARAMS, priority=[1], use_tqdm=False)
    for bad in (2**63, -(2**63) - 1, True, 1.5):
        with pytest.raises(InvalidRequestError, match="priority must be an integer"):
            llm.generate(PROMPTS[0], PARAMS, priority=[bad], use_tqdm=False)  # type: ignore[list-item]
    assert llm.generate(PROMPTS[0], PARAMS, priority=[-(2**63)], use_tqdm=False)[0].outputs[0].token_ids


def test_preemption_by_priority_keeps_every_request_s_tokens(tiny_llama: str) -> None:
    """A pool of 9 blocks for requests of up to 4 each: urgent requests that arrive while it is full
    preempt lazier ones (a sample group among them, swapped out whole; single requests recomputed), and
    every request still gets the tokens it gets alone."""
    llm = LLM(
        tiny_llama,
        scheduling_policy="priority",
        block_size=8,
        num_gpu_blocks_override=10,
        max_model_len=64,
        swap_space=0.01,
    )
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    samples = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=20, ignore_eos=True)
    prompts = [{"prompt_token_ids": [7 + i] * 9 + [40 + i]} for i in range(6)]
    requests = [
        (prompt, samples if i == 1 else greedy, priority)
        for i, (prompt, priority) in enumerate(zip(prompts, [5, 6, 4, 0, -1, 0]))
    ]
    alone = [llm.generate(prompt, params, use_tqdm=False)[0] for prompt, params, _ in requests]
    engine = llm.llm_engine
    finished = {}
    for i, (prompt, params, priority) in enumerate(requests):
        engine.add_request(f"r{i}", prompt, params, priority=priority)
        if i == 2:  # the lazy ones fill the pool before the urgent ones arrive
            for _ in range(8):
                finished.update((o.request_id, o) for o in engine.step() if o.finished)
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert engine.engine_core.scheduler.get_stats().num_preemptions_total > 0
    for i, expected in enumerate(alone):
        assert [s.token_ids for s in finished[f"r{i}"].outputs] == [s.token_ids for s in expected.outputs]


def test_unknown_policy_names_the_flag(tiny_llama: str) -> None:
    with pytest.raises(ConfigError, match="--scheduling-policy must be one of fcfs, priority"):
        LLM(tiny_llama, scheduling_policy="lottery")
