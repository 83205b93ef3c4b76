"""Beam search equals HF transformers' (num_beams, length_penalty, early_stopping, stop_token_ids as extra
EOS ids, min_tokens as min_new_tokens) on tiny random Llama and Qwen2 models, widths 2 to 4. The models'
EOS row is made competitive, so beams end at different lengths and the length penalty and stopping
rules matter. Per-token logprobs it cannot give are refused."""

import os
import random
import shutil
from collections import Counter

import pytest
import torch
from conftest import hf_beam_search

from pagedserve import LLM, BeamSearchParams, SamplingParams
from pagedserve.errors import InvalidRequestError
from pagedserve.outputs import CompletionOutput

MAX_TOKENS = 8
EOS = 2


def make_prompts() -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(3, 49152) for _ in range(n)] for n in (5, 16, 23)]


def eager_eos_model(source: str, target: str) -> str:
    """A copy of `source` whose EOS logit is about as high as the top one: its lm_head row for EOS points
    along the mean final hidden state of the test prompts."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        hidden = torch.cat([model.model(torch.tensor([p])).last_hidden_state[0] for p in make_prompts()])
        top = model.lm_head(hidden).max(dim=-1).values.mean()
        mean = hidden.mean(dim=0)
        model.lm_head.weight[EOS] = mean * (top / (hidden @ mean).mean())
    model.save_pretrained(target)
    for name in os.listdir(source):
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(os.path.join(source, name), target)
    return target


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tiny_model_factory, tmp_path_factory) -> tuple[LLM, object]:
    from transformers import AutoModelForCausalLM

    path = eager_eos_model(tiny_model_factory(request.param), str(tmp_path_factory.mktemp("eager-eos")))
    llm = LLM(path, block_size=8, kv_cache_memory="8MiB")
    assert llm.get_tokenizer().eos_token_id == EOS
    return llm, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@pytest.mark.sampled(by="model")
@pytest.mark.parametrize(
    "width, length_penalty, early_stopping, ignore_eos",
    [
        (2, 1.0, False, False),
        (4, 1.0, False, False),
        (2, 2.0, "never", False),
        (4, 0.0, True, False),
        (4, -1.0, False, False),
        (2, 1.0, False, True),
        (3, 1.0, True, False),
        (3, 2.0, True, False),
        (3, 0.5, "never", False),
        (3, -0.5, "never", False),
        (3, 2.0, False, False),
    ],
)
def test_beam_search_equals_hf(
    model, width: int, length_penalty: float, early_stopping: bool | str, ignore_eos: bool
) -> None:
    llm, hf = model
    params = BeamSearchParams(
        beam_width=width,
        max_tokens=MAX_TOKENS,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        ignore_eos=ignore_eos,
    )
    prompts = make_prompts()
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    ended_early = False
    for prompt, output in zip(prompts, outputs):
        beams, scores = hf_beam_search(hf, prompt, params, None if ignore_eos else EOS)
        ours = [sequence.tokens[len(prompt) :] for sequence in output.sequences]
        assert ours == beams
        ours_scores = [
            s.cum_logprob / len(tokens) ** length_penalty for s, tokens in zip(output.sequences, ours)
        ]
        assert ours_scores == pytest.approx(scores, abs=1e-4)
        ended_early |= any(len(tokens) < MAX_TOKENS for tokens in ours)
        assert all(
            (s.finish_reason == "stop") == (t[-1] == EOS and not ignore_eos)
            for s, t in zip(output.sequences, ours)
        )
    if ignore_eos or length_penalty <= 1.0:  # (a large penalty may favour long beams only)
        assert ended_early != ignore_eos, "EOS shortens some beams (unless ignored)"
    core = llm.llm_engine.engine_core
    assert not core.has_unfinished_requests() and core.get_stats().kv_cache_usage == 0.0


def test_beams_share_blocks(model) -> None:
    llm, _ = model
    engine = llm.llm_engine
    params = SamplingParams(n=4, temperature=0.0, max_tokens=6)
    engine.add_request("beams", list(range(100, 141)), params, beam_search=BeamSearchParams(4, 6))
    saved = []
    while engine.has_unfinished_requests():
        engine.step()
        saved.append(engine.engine_core.get_stats().num_blocks_saved)
    assert max(saved) >= 3 * 5, "4 beams share the prompt's 5 full blocks"
    assert saved[-1] == 0 and engine.engine_core.get_stats().kv_cache_usage == 0.0


def run_beam_search(
    llm: LLM, prompts: list[list[int]], params: BeamSearchParams, **sampling: object
) -> list[list[CompletionOutput]]:
    """Each prompt's best beams, best first, with `sampling` fields (stop_token_ids, min_tokens) that
    LLM.beam_search does not take: through the engine, as the server's use_beam_search."""
    engine = llm.llm_engine
    for index, prompt in enumerate(prompts):
        sampling_params = SamplingParams(
            n=params.beam_width, temperature=0.0, max_tokens=params.max_tokens, **sampling
        )
        engine.add_request(f"b{index}", {"prompt_token_ids": prompt}, sampling_params, beam_search=params)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    return [finished[f"b{index}"].outputs for index in range(len(prompts))]


def ending_stop_token(hf, prompts: list[list[int]], params: BeamSearchParams, min_tokens: int) -> int:
    """A token that ends some of HF's best beams when it is a stop token: one that matters. Tried: the
    tokens HF's beams generate most often past min_tokens, EOS aside."""
    tokens = Counter(
        token
        for prompt in prompts
        for beam in hf_beam_search(hf, prompt, params, EOS, min_tokens)[0]
        for token in beam[max(1, min_tokens) :]
        if token != EOS
    )
    for token, _ in tokens.most_common(10):
        for prompt in prompts:
            if any(
                beam[-1] == token for beam in hf_beam_search(hf, prompt, params, [EOS, token], min_tokens)[0]
            ):
                return token
    raise AssertionError("no stop token ends a beam")


@pytest.mark.sampled(by="model")
@pytest.mark.parametrize("width, min_tokens, with_stop_token", [(2, 0, True), (3, 4, False), (4, 3, True)])
def test_stop_token_ids_and_min_tokens_equal_hf(
    model, width: int, min_tokens: int, with_stop_token: bool
) -> None:
    """A stop token ends a beam as EOS does (finish_reason "stop", stop_reason the token); under min_tokens
    neither may end one (HF: min_new_tokens). They were ignored."""
    llm, hf = model
    params = BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS)
    prompts = make_prompts()
    stop = [ending_stop_token(hf, prompts, params, min_tokens)] if with_stop_token else []
    outputs = run_beam_search(llm, prompts, params, stop_token_ids=stop, min_tokens=min_tokens)
    stopped_by_token = False
    for prompt, beams in zip(prompts, outputs):
        expected, scores = hf_beam_search(hf, prompt, params, [EOS, *stop], min_new_tokens=min_tokens)
        ours = [beam.token_ids for beam in beams]
        assert ours == expected
        assert [b.cumulative_logprob / len(b.token_ids) for b in beams] == pytest.approx(scores, abs=1e-4)
        for beam in beams:
            ended = beam.token_ids[-1] in (EOS, *stop)
            assert beam.finish_reason == ("stop" if ended else "length")
            assert beam.stop_reason == (beam.token_ids[-1] if ended and beam.token_ids[-1] != EOS else None)
            assert len(beam.token_ids) > min_tokens
            stopped_by_token |= beam.stop_reason is not None
    assert stopped_by_token == with_stop_token, "the stop token ends some beam"
    if min_tokens:
        unbounded = [hf_beam_search(hf, prompt, params, EOS)[0] for prompt in prompts]
        assert any(len(beam) <= min_tokens for beams in unbounded for beam in beams), "min_tokens matters"


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_per_token_logprobs_are_refused(model, field: str) -> None:
    """A beam keeps no per-token logprobs (the server's logprobs, and echo's prompt logprobs): refused,
    naming the field, rather than silently left out."""
    llm, _ = model
    params = SamplingParams(n=2, temperature=0.0, max_tokens=4, **{field: 1})
    with pytest.raises(InvalidRequestError, match=f"{field} cannot be combined with beam search") as info:
        llm.llm_engine.add_request("refused", [5, 6, 7], params, beam_search=BeamSearchParams(2, 4))
    assert info.value.param == field and not llm.llm_engine.has_unfinished_requests()
