"""Speculative decoding end to end: greedy outputs identical to decoding without it (tiny model with
preemption, prefix caching and mixed batches; SmolLM2 on copy-heavy prompts), and sampled outputs with
the same distribution (tiny-vocabulary model, chi-square)."""

import collections

import pytest
from scipy.stats import chi2_contingency

from pagedserve import LLM, SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def run(model: str, prompts: list, params: list[SamplingParams], **engine_args) -> tuple[list, LLM]:
    llm = LLM(model, **engine_args)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [[c.token_ids for c in o.outputs] for o in outputs], llm


def test_greedy_identical_under_preemption_prefix_caching_and_mixed_batches(tiny_llama: str) -> None:
    pattern = [[11, 12, 13, 14, 15, 16, 17, 18] * 6, [40 + i % 5 for i in range(45)]]
    prompts = [{"prompt_token_ids": pattern[i % 2] + [100 + i]} for i in range(8)]
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    params = [greedy] * 5 + [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, seed=3),
    ]
    # 24 blocks of 8 tokens for 8 requests of ~90 tokens: preemptions are certain.
    engine = dict(num_gpu_blocks_override=24, block_size=8, max_num_seqs=8, max_model_len=128)
    expected, _ = run(tiny_llama, prompts, params, **engine)
    actual, llm = run(tiny_llama, prompts, params, speculative_config=NGRAM, **engine)
    assert actual == expected
    stats = llm.llm_engine.engine_core.get_stats()
    assert stats.spec_decode_num_accepted_tokens > 0 and stats.num_preemptions_total > 0
    assert stats.prefix_cache_hits > 0


def test_greedy_identical_on_smollm2_copying_text(default_model: str) -> None:
    text = "Paged attention stores the KV cache in fixed-size blocks, so memory is allocated on demand. "
    prompts = [
        f"Repeat the following text exactly.\n\n{text * 2}\n\nRepeated text:\n",
        "def area(width, height):\n    return width * height\n\n\ndef volume(width, height, depth):\n",
    ]
    params = SamplingParams(temperature=0, max_tokens=32)
    expected, _ = run(default_model, prompts, [params] * 2, max_model_len=1024, kv_cache_memory="64MiB")
    actual, llm = run(
        default_model,
        prompts,
        [params] * 2,
        max_model_len=1024,
        kv_cache_memory="64MiB",
        speculative_config=NGRAM,
    )
    assert actual == expected
    stats = llm.llm_engine.engine_core.get_stats()
    assert stats.spec_decode_num_accepted_tokens > 0.3 * stats.spec_decode_num_draft_tokens


@pytest.fixture(scope="module")
def tiny_vocab_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    from conftest import build_tiny_model

    # 8 tokens and a large init: peaked but random next-token distributions.
    return build_tiny_model(
        str(tmp_path_factory.mktemp("vocab8")),
        "llama",
        vocab_size=8,
        initializer_range=0.5,
        bos_token_id=0,
        eos_token_id=7,
        pad_token_id=7,
    )


def test_sampled_outputs_keep_their_distribution(tiny_vocab_llama: str) -> None:
    prompt = {"prompt_token_ids": [1, 2, 3, 1, 2, 3, 1, 2]}
    num = 300
    params = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=i) for i in range(num)]
    base, _ = run(tiny_vocab_llama, [prompt] * num, params, max_num_seqs=num, max_model_len=64)
    spec, llm = run(
        tiny_vocab_llama, [prompt] * num, params, max_num_seqs=num, max_model_len=64, speculative_config=NGRAM
    )
    assert llm.llm_engine.engine_core.get_stats().spec_decode_num_draft_tokens > 0
    for position in range(3):
        counts = [collections.Counter(o[0][position] for o in outputs) for outputs in (base, spec)]
        tokens = sorted(set(counts[0]) | set(counts[1]))
        table = [[c.get(t, 0) for t in tokens] for c in counts]
        assert chi2_contingency(table).pvalue > 0.001, (position, table)


@pytest.mark.sampled
@pytest.mark.parametrize("target,draft", [("llama", "llama"), ("llama", "qwen2"), ("gemma2", "gemma2")])
def test_draft_model_greedy_identical_under_preemption(tiny_model_factory, target: str, draft: str) -> None:
    """A draft model sharing the tokenizer: the target itself (drafts almost always accepted) or an
    unrelated random model (mostly rejected). Either way the output is the target's. Gemma 2 has two KV
    cache groups: the draft's layers read the full-attention group's tables."""
    num_groups = 2 if target == "gemma2" else 1
    target = tiny_model_factory(target)
    prompts = [{"prompt_token_ids": [30 + (i * 7 + j) % 50 for j in range(20 + 5 * i)]} for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine = dict(num_gpu_blocks_override=20 * num_groups, block_size=8, max_num_seqs=6, max_model_len=96)
    expected, _ = run(target, prompts, [params] * 6, **engine)
    spec = {"method": "draft_model", "model": tiny_model_factory(draft), "num_speculative_tokens": 3}
    actual, llm = run(target, prompts, [params] * 6, speculative_config=spec, **engine)
    assert actual == expected
    stats = llm.llm_engine.engine_core.get_stats()
    assert stats.num_preemptions_total > 0 and stats.spec_decode_num_draft_tokens > 0
    if draft != "qwen2":  # the target itself
        assert stats.spec_decode_num_accepted_tokens > 0.8 * stats.spec_decode_num_draft_tokens


def test_seeded_sampling_identical_with_and_without_drafts(tiny_vocab_llama: str) -> None:
    """A seeded request draws each position's token from (seed, position) alone: whether its steps had
    drafts (which the token budget and the batch decide) does not change its tokens."""
    prompt = {"prompt_token_ids": [1, 2, 3, 1, 2, 3, 1, 2]}
    params = [SamplingParams(temperature=0.7, max_tokens=30, ignore_eos=True, seed=i) for i in range(6)]
    engine = dict(max_model_len=64, kv_cache_memory="4MiB")
    expected, _ = run(tiny_vocab_llama, [prompt] * 6, params, **engine)
    actual, llm = run(tiny_vocab_llama, [prompt] * 6, params, speculative_config=NGRAM, **engine)
    assert actual == expected
    stats = llm.llm_engine.engine_core.get_stats()
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


def test_penalties_and_min_tokens_identical_with_and_without_drafts(tiny_vocab_llama: str) -> None:
    """Penalties and min_tokens depend on every earlier output token: a verified position counts the
    drafts before it, so the tokens equal one-at-a-time decoding (8 tokens: repeats are constant)."""
    prompt = {"prompt_token_ids": [1, 2, 3, 1, 2, 3, 1, 2]}
    params = [
        SamplingParams(temperature=0, max_tokens=30, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=30, frequency_penalty=0.3, presence_penalty=0.2),
        SamplingParams(temperature=0, max_tokens=30, min_tokens=20, stop_token_ids=[3]),
        SamplingParams(temperature=0.8, max_tokens=30, repetition_penalty=1.2, min_tokens=10, seed=4),
    ]
    engine = dict(max_model_len=64, kv_cache_memory="4MiB")
    expected, _ = run(tiny_vocab_llama, [prompt] * 4, params, **engine)
    actual, llm = run(tiny_vocab_llama, [prompt] * 4, params, speculative_config=NGRAM, **engine)
    assert actual == expected
    stats = llm.llm_engine.engine_core.get_stats()
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


@pytest.mark.sampled
@pytest.mark.parametrize("speculative_config", [NGRAM, "draft"], ids=["ngram", "draft_model"])
def test_constrained_requests_beside_speculating_ones_keep_their_grammar(
    default_model: str, speculative_config: object
) -> None:
    """Constrained requests share steps with requests that verify drafts: every step masks them."""
    import re

    from pagedserve.structured_outputs_params import StructuredOutputsParams

    if speculative_config == "draft":
        speculative_config = {"model": default_model, "num_speculative_tokens": 3}
    text = "one, two, three, four, five, six, seven, eight, nine, ten, " * 4
    copying = [f"Repeat exactly:\n{text}\nRepeated:\n{text[:40]}"] * 4
    pattern = r"[0-9]{3}-[a-z]{4}"
    constrained = SamplingParams(
        temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(regex=pattern)
    )
    free = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    prompts = copying + ["Give me a code."] * 4
    outputs, llm = run(
        default_model,
        prompts,
        [free] * 4 + [constrained] * 4,
        max_model_len=512,
        kv_cache_memory="64MiB",
        speculative_config=speculative_config,
    )
    stats = llm.llm_engine.engine_core.get_stats()
    assert stats.spec_decode_num_accepted_tokens > 0
    texts = [llm.get_tokenizer().decode(tokens[0], skip_special_tokens=True) for tokens in outputs[4:]]
    assert all(re.fullmatch(pattern, t) for t in texts), texts


@pytest.mark.sampled
@pytest.mark.parametrize("stop", [["nectarine"], ["orange", "nectarine"]])
def test_stop_strings_crossing_drafts_end_as_without_speculation(default_model: str, stop: list[str]) -> None:
    """An accepted draft that runs past a stop string: text, token ids, logprobs and stop_reason are
    those without speculation (the earliest stop string in the text wins)."""
    fruits = "apple, banana, mango, nectarine, orange, pear, plum, " * 3
    prompt = f"Repeat exactly:\n{fruits}\nRepeated:\n{fruits}"
    params = SamplingParams(temperature=0, max_tokens=40, stop=stop)
    engine = dict(max_model_len=512, kv_cache_memory="64MiB")
    expected = LLM(default_model, **engine).generate([prompt], params, use_tqdm=False)[0].outputs[0]
    llm = LLM(default_model, speculative_config=NGRAM, **engine)
    actual = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert llm.llm_engine.engine_core.get_stats().spec_decode_num_accepted_tokens > 0
    assert expected.stop_reason == "nectarine"
    fields = ("text", "token_ids", "stop_reason", "finish_reason")
    assert [getattr(actual, f) for f in fields] == [getattr(expected, f) for f in fields]


@pytest.mark.sampled
@pytest.mark.parametrize("pattern", [r"[a-z, ]+", r"[a-z ]+"], ids=["drafts_fit", "drafts_break_it"])
def test_constrained_requests_speculate_within_their_grammar(default_model: str, pattern: str) -> None:
    """A constrained request verifies drafts against its grammar at every position: the same output as
    without speculation (drafts with a comma the grammar forbids are rejected), and drafts accepted."""
    import re

    from pagedserve.structured_outputs_params import StructuredOutputsParams

    text = "one, two, three, four, five, six, seven, eight, nine, ten, " * 3
    prompt = f"Repeat exactly:\n{text}\nRepeated:\n{text[:30]}"
    params = SamplingParams(
        temperature=0, max_tokens=30, structured_outputs=StructuredOutputsParams(regex=pattern)
    )
    engine = dict(max_model_len=512, kv_cache_memory="64MiB")
    expected = LLM(default_model, **engine).generate([prompt], params, use_tqdm=False)[0].outputs[0]
    llm = LLM(default_model, speculative_config=NGRAM, **engine)
    actual = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert (actual.text, actual.token_ids) == (expected.text, expected.token_ids)
    assert re.fullmatch(pattern, actual.text)
    assert llm.llm_engine.engine_core.get_stats().spec_decode_num_accepted_tokens > 0
