"""Beam search equals HF transformers' (num_beams, length_penalty, early_stopping) on tiny random Llama and
Qwen2 models, widths 2 and 4. The models' EOS row is made competitive, so beams end at different
lengths and the length penalty and stopping rules matter."""

import os
import random
import shutil

import pytest
import torch
from conftest import hf_beam_search

from pagedserve import LLM, BeamSearchParams, SamplingParams

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
