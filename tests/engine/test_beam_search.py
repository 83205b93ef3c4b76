"""Beam search equals HF transformers' (num_beams, length_penalty, early_stopping, stop_token_ids as extra
EOS ids, min_tokens as min_new_tokens) on tiny random Llama and Qwen2 models, widths 2 to 4. The models'
EOS row is made competitive, so beams end at different lengths and the length penalty and stopping
rules matter. repetition_penalty and logit_bias equal HF's (sequence_bias), presence/frequency penalties
equal a processor with vLLM's semantics in HF's beam search. Fields it cannot honour are refused."""

import os
import random
import shutil
from collections import Counter

import pytest
import torch
from conftest import hf_beam_search
from transformers import LogitsProcessor, LogitsProcessorList

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


@pytest.mark.parametrize(
    "field, value",
    [
        ("logprobs", 1),
        ("prompt_logprobs", 1),
        ("temperature", 0.7),
        ("top_p", 0.9),
        ("top_k", 5),
        ("min_p", 0.1),
        ("stop", ["."]),
    ],
)
def test_fields_beams_cannot_honour_are_refused(model, field: str, value: object) -> None:
    """A beam keeps no per-token logprobs (the server's logprobs, and echo's prompt logprobs), ranks by
    log-probabilities (no sampling knob), and ends on tokens (no stop strings): each refused, naming the
    field, rather than silently ignored."""
    llm, _ = model
    params = SamplingParams(**{"n": 2, "temperature": 0.0, "max_tokens": 4, field: value})
    with pytest.raises(InvalidRequestError, match="cannot be combined with beam search") as info:
        llm.llm_engine.add_request("refused", [5, 6, 7], params, beam_search=BeamSearchParams(2, 4))
    assert info.value.param == field and not llm.llm_engine.has_unfinished_requests()


class PresenceFrequency(LogitsProcessor):
    """vLLM's presence and frequency penalties over each beam's generated tokens, as a processor of HF's
    beam search (which applies it to the log-softmax, after its own processors)."""

    def __init__(self, prompt_length: int, presence: float, frequency: float) -> None:
        self.prompt_length, self.presence, self.frequency = prompt_length, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.prompt_length :]
        counts = torch.zeros_like(scores).scatter_add_(
            1, generated, torch.ones_like(scores[:, :1]).expand_as(generated)
        )
        return scores - self.frequency * counts - self.presence * (counts > 0)


def hf_processed_beam_search(hf, prompt: list[int], params: BeamSearchParams, processed: dict) -> list:
    """HF's beams and scores with `processed` (SamplingParams' penalty and bias fields) as HF's own
    repetition_penalty and sequence_bias, presence/frequency as PresenceFrequency."""
    bias = processed.get("logit_bias") or {}
    return hf_beam_search(
        hf,
        prompt,
        params,
        EOS,
        repetition_penalty=processed.get("repetition_penalty", 1.0),
        sequence_bias={(token,): value for token, value in bias.items()} or None,
        logits_processor=LogitsProcessorList(
            [
                PresenceFrequency(
                    len(prompt),
                    processed.get("presence_penalty", 0.0),
                    processed.get("frequency_penalty", 0.0),
                )
            ]
        ),
    )


def most_generated_token(beams: list[list[list[int]]]) -> int:
    """The token HF's plain beams (per prompt) generate most often, EOS aside: biasing it matters."""
    tokens = Counter(token for prompt_beams in beams for beam in prompt_beams for token in beam)
    return next(token for token, _ in tokens.most_common() if token != EOS)


@pytest.mark.sampled(by="model")
@pytest.mark.parametrize(
    "width, repetition, presence, frequency, bias",
    [
        (2, 1.5, 0.0, 0.0, 0.0),
        (2, 1.0, 0.0, 0.0, 100.0),
        (4, 1.3, 0.5, 0.8, -2.0),
        (3, 0.8, 1.5, 2.0, 4.0),
    ],
)
def test_penalties_and_bias_equal_hf(
    model, width: int, repetition: float, presence: float, frequency: float, bias: float
) -> None:
    """Each beam's logprobs are processed as HF's beam search processes them (the log-softmax, then
    sequence_bias, repetition_penalty over the beam's prompt and tokens, then presence/frequency as vLLM
    applies them): the beams and scores are HF's. They were ignored: a +100 bias left the beams as they
    were, where greedy picks the token every time."""
    llm, hf = model
    params = BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS)
    prompts = make_prompts()
    plain = [hf_beam_search(hf, prompt, params, EOS)[0] for prompt in prompts]
    biased = most_generated_token(plain)
    processed = dict(
        repetition_penalty=repetition,
        presence_penalty=presence,
        frequency_penalty=frequency,
        logit_bias={biased: bias} if bias else None,
    )
    outputs = run_beam_search(llm, prompts, params, **processed)
    changed = False
    for prompt, beams, unprocessed in zip(prompts, outputs, plain):
        expected, scores = hf_processed_beam_search(hf, prompt, params, processed)
        ours = [beam.token_ids for beam in beams]
        assert ours == expected
        assert [b.cumulative_logprob / len(b.token_ids) for b in beams] == pytest.approx(scores, abs=1e-4)
        changed |= expected != unprocessed
        if bias == 100.0:
            assert ours[0] == [biased] * MAX_TOKENS
    assert changed, "the processors change some prompt's beams"
