"""Sampling: logprobs against HF, seeded reproducibility across batch compositions, stop conditions."""

import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.outputs import Logprob


@pytest.fixture(scope="module")
def llm(tiny_llama: str) -> LLM:
    return LLM(tiny_llama, max_model_len=256, kv_cache_memory="16MiB", block_size=8)


@pytest.fixture(scope="module")
def hf_model(tiny_llama: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)


def _assert_logprob(entry: Logprob, token_id: int, row: torch.Tensor, tokenizer) -> None:
    """vLLM's `Logprob` of `token_id` against the reference distribution `row`: its value, its rank (the
    tokens at least as likely, itself included; a tie within the tolerance may count either way) and its
    text on its own."""
    value = row[token_id].item()
    assert isinstance(entry, Logprob) and entry.logprob == pytest.approx(value, abs=1e-4)
    assert int((row > value + 1e-4).sum()) < entry.rank <= int((row >= value - 1e-4).sum())
    assert entry.decoded_token == tokenizer.decode([token_id])


def test_logprobs_equal_hf_log_softmax(llm: LLM, hf_model) -> None:
    """Sampled and prompt logprobs as vLLM gives them (token id -> Logprob: value, rank, text) equal HF's
    log-softmax; the sampled (chosen) token comes first, its cumulative sum is the sample's."""
    prompt = [11, 500, 7, 9000, 42, 42, 3000]
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=5, prompt_logprobs=3, ignore_eos=True)
    output = llm.generate([prompt], params, use_tqdm=False)[0]
    completion, tokenizer = output.outputs[0], llm.get_tokenizer()
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        reference = torch.log_softmax(hf_model(ids).logits[0].float(), dim=-1)
    for step, (token, logprobs) in enumerate(zip(completion.token_ids, completion.logprobs)):
        row = reference[len(prompt) - 1 + step]
        assert next(iter(logprobs)) == token  # the sampled token comes first
        top = row.topk(5)
        assert set(top.indices.tolist()) <= set(logprobs)
        for token_id, entry in logprobs.items():
            _assert_logprob(entry, token_id, row, tokenizer)
    assert completion.cumulative_logprob == pytest.approx(
        sum(reference[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion.token_ids)), abs=1e-3
    )
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(prompt)
    for position in range(1, len(prompt)):
        entry = output.prompt_logprobs[position]
        assert next(iter(entry)) == prompt[position] and len(entry) >= 3
        for token_id, logprob in entry.items():
            _assert_logprob(logprob, token_id, reference[position - 1], tokenizer)


def test_prompt_logprobs_across_chunks(tiny_llama: str, llm: LLM) -> None:
    prompt = list(range(100, 160))
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    whole = llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    chunked_llm = LLM(tiny_llama, max_model_len=256, kv_cache_memory="16MiB", max_num_batched_tokens=16)
    chunked = chunked_llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    assert len(chunked) == len(whole) == len(prompt)
    for a, b in zip(whole[1:], chunked[1:]):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-4) for k in a)


def test_seeded_sampling_independent_of_batch(llm: LLM) -> None:
    target = [5, 6, 7, 8]
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=10, ignore_eos=True)
    alone = llm.generate([target], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [
        SamplingParams(temperature=1.0, max_tokens=7, ignore_eos=True),
        SamplingParams(temperature=0.5, seed=7, max_tokens=12, ignore_eos=True),
    ]
    batch = llm.generate([[1000, 2000], target, [3] * 30], [others[0], params, others[1]], use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone
    other_seed = SamplingParams(
        temperature=0.9, top_p=0.95, top_k=50, seed=99, max_tokens=10, ignore_eos=True
    )
    assert llm.generate([target], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_n_samples_are_distinct_and_reproducible(llm: LLM) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)
    first = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0]
    again = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0]
    assert [o.index for o in first.outputs] == [0, 1, 2]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in again.outputs]
    assert len({tuple(o.token_ids) for o in first.outputs}) > 1


def test_top_k_one_is_greedy(llm: LLM) -> None:
    greedy = (
        llm.generate(
            [[9, 8, 7]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False
        )[0]
        .outputs[0]
        .token_ids
    )
    top1 = (
        llm.generate(
            [[9, 8, 7]],
            SamplingParams(temperature=1.3, top_k=1, max_tokens=8, ignore_eos=True),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .token_ids
    )
    assert top1 == greedy


def test_stop_strings_and_tokens(llm: LLM) -> None:
    base = llm.generate(
        [[9, 8, 7]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    stop_text = base.text[len(base.text) // 2 :][:3]
    cut = base.text.index(stop_text)
    stopped = llm.generate(
        [[9, 8, 7]], SamplingParams(temperature=0.0, max_tokens=12, stop=[stop_text]), use_tqdm=False
    )[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_text
    assert stopped.text == base.text[:cut]
    included = llm.generate(
        [[9, 8, 7]],
        SamplingParams(temperature=0.0, max_tokens=12, stop=[stop_text], include_stop_str_in_output=True),
        use_tqdm=False,
    )
    assert included[0].outputs[0].text == base.text[: cut + len(stop_text)]
    token = base.token_ids[4]
    by_token = llm.generate(
        [[9, 8, 7]], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[token]), use_tqdm=False
    )[0].outputs[0]
    assert by_token.token_ids == base.token_ids[: base.token_ids.index(token) + 1]
    assert by_token.stop_reason == token and by_token.finish_reason == "stop"


def test_penalties_and_logit_bias(llm: LLM) -> None:
    prompt = [9, 8, 7]
    base = (
        llm.generate(
            [prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False
        )[0]
        .outputs[0]
        .token_ids
    )
    biased = llm.generate(
        [prompt],
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logit_bias={777: 100.0}),
        use_tqdm=False,
    )[0].outputs[0]
    assert biased.token_ids == [777] * 8
    assert len(set(base)) < len(base), "the tiny model repeats itself greedily"
    penalized = llm.generate(
        [prompt],
        SamplingParams(
            temperature=0.0,
            max_tokens=8,
            ignore_eos=True,
            frequency_penalty=2.0,
            presence_penalty=2.0,
            repetition_penalty=2.0,
        ),
        use_tqdm=False,
    )
    assert len(set(penalized[0].outputs[0].token_ids)) > len(set(base))


def test_max_tokens_none_fills_context_and_min_tokens(llm: LLM) -> None:
    output = llm.generate(
        [[5] * 250], SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    assert len(output.token_ids) == 6 and output.finish_reason == "length"
    eos = llm.get_tokenizer().eos_token_id
    forced = llm.generate(
        [[5, 6]],
        SamplingParams(temperature=0.0, max_tokens=6, min_tokens=6, logit_bias={eos: 100.0}),
        use_tqdm=False,
    )[0].outputs[0]
    assert len(forced.token_ids) == 6 and eos not in forced.token_ids[:5]


@pytest.mark.sampled
@pytest.mark.parametrize("max_num_batched_tokens", [512, 16], ids=["whole", "chunked"])
def test_prompt_logprobs_once_per_position_after_recompute_preemption(
    tiny_llama: str, llm: LLM, max_num_batched_tokens: int
) -> None:
    """A request recomputed after a preemption computes its prompt again; it reports each prompt
    position's logprobs once, equal to those of an unpreempted run."""
    prompts = [list(range(100 + i, 140 + i)) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=30, prompt_logprobs=1, ignore_eos=True)
    alone = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    # 18 blocks of 8 tokens for 4 requests of 70 tokens: recompute preemptions are certain.
    tight = LLM(
        tiny_llama,
        max_model_len=128,
        block_size=8,
        num_gpu_blocks_override=19,
        preemption_mode="recompute",
        max_num_batched_tokens=max_num_batched_tokens,
    )
    outputs = tight.generate(prompts, params, use_tqdm=False)
    assert tight.llm_engine.engine_core.get_stats().num_preemptions_total > 0
    for prompt, output, reference in zip(prompts, outputs, alone):
        assert len(output.prompt_logprobs) == len(prompt)
        assert output.prompt_logprobs[0] is None and None not in output.prompt_logprobs[1:]
        for a, b in zip(output.prompt_logprobs[1:], reference.prompt_logprobs[1:]):
            assert a.keys() == b.keys() and all(
                a[k].logprob == pytest.approx(b[k].logprob, abs=1e-4) for k in a
            )
        assert output.outputs[0].token_ids == reference.outputs[0].token_ids


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_bans_eos_only_when_eos_stops(ignore_eos: bool) -> None:
    """Under min_tokens, stop_token_ids are banned, and EOS only when it would stop the request (with
    ignore_eos it is a plain token, as in vLLM)."""
    from pagedserve.worker.request_state import CachedRequestState
    from pagedserve.worker.sampling_inputs import build_sampling_metadata

    params = SamplingParams(min_tokens=4, stop_token_ids=[7], ignore_eos=ignore_eos, max_tokens=8)
    state = CachedRequestState("r", 3, params, 2)
    bias = build_sampling_metadata([state], [[1, 2, 3]], 16, torch.device("cpu")).logit_bias
    assert bias is not None and bias[0, 7] == float("-inf")
    assert (bias[0, 2] == float("-inf")) != ignore_eos
