"""vLLM's offline idioms run as written: its `LLMEngine` loop (names imported from the package's top
level, prompts as `TextPrompt` / `TokensPrompt`) and its `Logprob` objects."""

from pagedserve import (
    LLM,
    EngineArgs,
    LLMEngine,
    SamplingParams,
    TextPrompt,
    TokensPrompt,
)
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
