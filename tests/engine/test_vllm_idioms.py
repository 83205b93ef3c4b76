"""vLLM's offline idioms run as written: its `LLMEngine` loop and its `AsyncLLMEngine` script (names
imported from the package's top level, prompts as `TextPrompt` / `TokensPrompt`), its `Logprob` objects,
`LLM.sleep()` / `wake_up()`."""

import asyncio

import pytest

from pagedserve import (
    LLM,
    AsyncEngineArgs,
    AsyncLLMEngine,
    EngineArgs,
    LLMEngine,
    SamplingParams,
    TextPrompt,
    TokensPrompt,
)
from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.outputs import Logprob, RequestOutput


def test_the_llm_engine_loop_of_vllms_example(tiny_llama: str) -> None:
    """vLLM's llm_engine_example: add a request per step while any are left, step until none is
    unfinished. Each request's output equals `LLM.generate`'s; its logprobs are `Logprob`s."""
    settings = dict(model=tiny_llama, max_model_len=128, kv_cache_memory="8MiB", block_size=8)
    greedy = SamplingParams(temperature=0.0, max_tokens=6, logprobs=2, prompt_logprobs=1, ignore_eos=True)
    seeded = SamplingParams(n=2, best_of=3, temperature=0.8, seed=7, max_tokens=6, ignore_eos=True)
    prompts = [
        (TextPrompt(prompt="To be or not to be,"), greedy),
        (TokensPrompt(prompt_token_ids=[11, 500, 7, 9000]), seeded),
        ("What is LLM?", greedy),
    ]
    engine = LLMEngine.from_engine_args(EngineArgs(**settings))
    pending, finished, request_id = list(prompts), {}, 0
    while pending or engine.has_unfinished_requests():
        if pending:
            prompt, params = pending.pop(0)
            engine.add_request(str(request_id), prompt, params)
            request_id += 1
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    assert sorted(finished) == ["0", "1", "2"]
    expected = LLM(**settings).generate([p for p, _ in prompts], [s for _, s in prompts], use_tqdm=False)
    for index, reference in enumerate(expected):
        output: RequestOutput = finished[str(index)]
        assert [o.token_ids for o in output.outputs] == [o.token_ids for o in reference.outputs]
        assert [o.logprobs for o in output.outputs] == [o.logprobs for o in reference.outputs]
    for output in (finished["0"], finished["2"]):
        for token, position in zip(output.outputs[0].token_ids, output.outputs[0].logprobs):
            chosen = position[token]  # greedy: the most likely token, ranked first
            assert isinstance(chosen, Logprob) and chosen.rank == 1 and chosen.logprob <= 0.0
            assert chosen.decoded_token == engine.get_tokenizer().decode([token])


def test_async_llm_engine_as_vllm_scripts_use_it(tiny_llama: str) -> None:
    """vLLM's AsyncLLMEngine script: from_engine_args() outside any event loop, then concurrent
    `async for` over generate() in asyncio.run. Each request's cumulative outputs end with LLM.generate's
    tokens; a burst far past what the engine runs at once waits whole (no server queue limit); leaving a
    loop early or abort() from another task ends the request (the engine holds none after); bad settings
    raise at from_engine_args."""
    settings = dict(model=tiny_llama, max_model_len=128, kv_cache_memory="8MiB", block_size=8, max_num_seqs=4)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = ["To be or not to be,", "What is LLM?", "Hello"]
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**settings))

    async def tokens(index: int) -> list[int]:
        outputs = [out async for out in engine.generate(prompts[index], params, f"r{index}")]
        assert outputs[-1].finished and not any(out.finished for out in outputs[:-1])
        assert [len(out.outputs[0].token_ids) for out in outputs] == sorted(
            {len(out.outputs[0].token_ids) for out in outputs}
        )
        return outputs[-1].outputs[0].token_ids

    async def ended_early() -> tuple[str | None, int]:
        long = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
        async for _ in engine.generate("Left early", long, "early"):
            break  # the generator is closed: the request is aborted
        aborted = engine.generate("Aborted", long, "aborted")
        first = await anext(aborted)
        await engine.abort("aborted")
        last = [out async for out in aborted][-1] if not first.finished else first
        await asyncio.sleep(0.2)
        return last.outputs[0].finish_reason, engine.engine.num_requests_in_flight

    async def burst() -> list[int]:
        """40 requests at once: ten times what the engine runs (max_num_seqs 4), twice its default queue."""
        short = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

        async def last(index: int) -> RequestOutput:
            return [out async for out in engine.generate(f"Burst {index}", short, f"b{index}")][-1]

        ends = await asyncio.gather(*(last(i) for i in range(40)))
        return [len(end.outputs[0].token_ids) for end in ends]

    async def script() -> tuple[list[list[int]], tuple[str | None, int]]:
        results = await asyncio.gather(*(tokens(i) for i in range(len(prompts))))
        assert await burst() == [1] * 40
        return list(results), await ended_early()

    try:
        generated, (finish_reason, in_flight) = asyncio.run(script())
    finally:
        engine.shutdown()
    expected = LLM(**settings).generate(prompts, params, use_tqdm=False)
    assert generated == [out.outputs[0].token_ids for out in expected]
    assert finish_reason == "abort" and in_flight == 0
    with pytest.raises(ConfigError, match="block"):
        AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**{**settings, "block_size": 7}))


def test_sleep_and_wake_up_as_rlhf_loops_call_them(tiny_llama: str) -> None:
    """vLLM's LLM(enable_sleep_mode=True).sleep(level) / wake_up(tags) (TRL's colocated loop): the weights
    and KV cache are freed and loaded again, and greedy tokens are the same after each; bad levels and
    tags name the argument; without sleep mode, sleep() says how to turn it on."""
    settings = dict(max_model_len=128, kv_cache_memory="8MiB", block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    llm = LLM(tiny_llama, enable_sleep_mode=True, **settings)
    core = llm.llm_engine.engine_core
    before = llm.generate("To be or not to be,", params, use_tqdm=False)[0].outputs[0].token_ids
    for level in (1, 2):
        llm.sleep(level=level)
        assert core.sleep_level == level
        llm.wake_up(tags=["weights"])
        llm.wake_up(tags=["kv_cache"])  # already awake: a no-op
        assert core.sleep_level == 0
        assert llm.generate("To be or not to be,", params, use_tqdm=False)[0].outputs[0].token_ids == before
    llm.sleep()
    assert llm.generate("To be or not to be,", params, use_tqdm=False)[0].outputs[0].token_ids == before
    for level in (3, 0, True, -1, 2**64, float("nan"), "1"):
        with pytest.raises(InvalidRequestError, match="`level` must be 1 or 2"):
            llm.sleep(level=level)
    with pytest.raises(InvalidRequestError, match="'optimizer'"):
        llm.wake_up(tags=["weights", "optimizer"])
    with pytest.raises(ConfigError, match="enable_sleep_mode=True"):
        LLM(tiny_llama, **settings).sleep()
