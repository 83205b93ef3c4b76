"""The embedded default model (SmolLM2-135M-Instruct from its GGUF) against HF transformers."""

import pytest
import torch
from conftest import hf_beam_search

from pagedserve import LLM, BeamSearchParams, SamplingParams


def test_default_model_greedy_matches_hf(default_llm: LLM, default_hf_model) -> None:
    model = default_hf_model
    prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village, there lived a very curious cat who",
    ]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = default_llm.generate(prompts, params, use_tqdm=False)
    for output in outputs:
        ids = torch.tensor([output.prompt_token_ids])
        expected = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert output.outputs[0].token_ids == expected[0, ids.shape[1] :].tolist()
    tokenizer = default_llm.get_tokenizer()
    assert outputs[0].outputs[0].text == tokenizer.decode(
        outputs[0].outputs[0].token_ids, skip_special_tokens=True
    )
    assert "Paris" in outputs[0].outputs[0].text


def test_default_model_chat_stops_at_eos(default_llm: LLM) -> None:
    outputs = default_llm.chat(
        [{"role": "user", "content": "Say hello."}],
        SamplingParams(temperature=0.0, max_tokens=64),
        use_tqdm=False,
    )
    completion = outputs[0].outputs[0]
    assert completion.finish_reason == "stop"
    assert completion.text.strip()
    assert "<|im_end|>" not in completion.text


@pytest.mark.sampled
@pytest.mark.parametrize("early_stopping, length_penalty", [(True, 1.0), ("never", 0.5)])
def test_default_model_beam_search_with_eos_equals_hf(
    default_llm: LLM, default_hf_model, early_stopping: bool | str, length_penalty: float
) -> None:
    """Issue 10's case: num_beams=3 with EOS (<|im_end|>, the GGUF's and HF's only EOS) among the
    candidates: chat prompts whose answers end soon and a raw prompt, so beams end at different lengths.
    Token ids and scores of every returned beam equal HF's. (More early_stopping / length_penalty
    settings: tests/engine/test_beam_search.py on tiny models.)"""
    tokenizer = default_llm.get_tokenizer()
    assert tokenizer.eos_token_id == default_hf_model.generation_config.eos_token_id == 2
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for question in ("Hi", "What is 2+2? Answer with a number only.")
    ]
    prompts.append(tokenizer.encode("Question: What color is the sky?\nAnswer:"))
    params = BeamSearchParams(
        beam_width=3, max_tokens=10, length_penalty=length_penalty, early_stopping=early_stopping
    )
    outputs = default_llm.beam_search([{"prompt_token_ids": list(p)} for p in prompts], params)
    ended_with_eos = 0
    for prompt, output in zip(prompts, outputs):
        beams, scores = hf_beam_search(default_hf_model, list(prompt), params, tokenizer.eos_token_id)
        ours = [sequence.tokens[len(prompt) :] for sequence in output.sequences]
        assert ours == beams
        # Every logprob within 2e-3 of max(|HF's|, 1) (16-bit activation blocks, prompt and decode alike:
        # docs/quantization.md); a beam's score within 2e-3 of its magnitude (measured: 1.05e-3 at most).
        assert [
            s.cum_logprob / len(tokens) ** length_penalty for s, tokens in zip(output.sequences, ours)
        ] == pytest.approx(scores, rel=2e-3, abs=2e-3)
        assert all(
            (s.finish_reason == "stop") == (tokens[-1] == tokenizer.eos_token_id)
            for s, tokens in zip(output.sequences, ours)
        )
        ended_with_eos += sum(
            beam[-1] == tokenizer.eos_token_id and len(beam) < params.max_tokens for beam in beams
        )
    assert ended_with_eos, "EOS competed: some best beam ends early with it"
