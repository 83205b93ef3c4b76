"""Parallel sampling (n, best_of) with the prompt's blocks shared: reproducible with a seed, each sample
sees only its own tokens (its logprobs equal HF's over its own sequence), best_of keeps the n best by
cumulative logprob, and the blocks are really shared."""

import pytest
import torch

from pagedserve import LLM, SamplingParams

PROMPT = [11, 500, 7, 9000, 42, 42, 3000, 17, 23, 99, 1234, 8, 77]  # 13 tokens: a partly filled block
SEEDED = SamplingParams(n=4, temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def llm(tiny_llama: str) -> LLM:
    return LLM(tiny_llama, block_size=8, kv_cache_memory="8MiB")


def samples(llm: LLM, params: SamplingParams, prompt: list[int] = PROMPT) -> list[list[int]]:
    return [o.token_ids for o in llm.generate([prompt], params, use_tqdm=False)[0].outputs]


def test_seeded_samples_are_reproducible_and_differ(llm: LLM) -> None:
    first = samples(llm, SEEDED)
    others = [[5, 6, 7], list(range(40, 61))]
    batch = llm.generate(
        [PROMPT, *others], [SEEDED, SamplingParams(n=3, max_tokens=5), SEEDED], use_tqdm=False
    )
    assert [o.token_ids for o in batch[0].outputs] == first == samples(llm, SEEDED)
    assert len({tuple(s) for s in first}) == 4, "the samples differ"


def test_greedy_samples_equal_one_greedy_request(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    one = samples(llm, greedy)[0]
    assert samples(llm, SamplingParams(n=3, temperature=0.0, max_tokens=8, ignore_eos=True)) == [one] * 3


def test_each_sample_sees_only_its_own_tokens(tiny_llama: str, llm: LLM) -> None:
    """Copy-on-write: a sample that read another's K/V would report logprobs HF does not compute."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    output = llm.generate([PROMPT], SEEDED, use_tqdm=False)[0]
    for sample in output.outputs:
        with torch.no_grad():
            logits = hf(torch.tensor([PROMPT + sample.token_ids])).logits[0]
        reference = torch.log_softmax(logits.float(), dim=-1)
        for step, (token, logprobs) in enumerate(zip(sample.token_ids, sample.logprobs)):
            assert logprobs[token].logprob == pytest.approx(
                reference[len(PROMPT) - 1 + step, token].item(), abs=1e-4
            )


def test_best_of_returns_the_n_best_by_cumulative_logprob(llm: LLM) -> None:
    all_five = llm.generate(
        [PROMPT],
        SamplingParams(n=5, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True, logprobs=0),
        use_tqdm=False,
    )[0].outputs
    best = llm.generate(
        [PROMPT],
        SamplingParams(n=2, best_of=5, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs
    expected = sorted(all_five, key=lambda o: -o.cumulative_logprob)[:2]
    assert [o.token_ids for o in best] == [o.token_ids for o in expected]
    assert [o.index for o in best] == [0, 1] and best[0].logprobs is None
    assert [o.cumulative_logprob for o in best] == pytest.approx([o.cumulative_logprob for o in expected])


def test_the_prompt_blocks_are_shared(llm: LLM) -> None:
    engine = llm.llm_engine
    prompt = list(range(100, 141))  # 5 full blocks of 8 and one token
    engine.add_request("shared", prompt, SamplingParams(n=4, temperature=1.0, max_tokens=6, ignore_eos=True))
    saved = []
    while engine.has_unfinished_requests():
        engine.step()
        saved.append(engine.engine_core.get_stats().num_blocks_saved)
    # Once forked, 3 samples share the leader's 5 full blocks.
    assert max(saved) >= 15 and saved[-1] == 0
    assert engine.engine_core.get_stats().kv_cache_usage == 0.0
