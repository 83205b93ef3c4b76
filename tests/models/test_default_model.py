"""The embedded default model (SmolLM2-135M-Instruct from its GGUF, the blocks kept quantized: the default)
against HF transformers' dequantized float32 model: greedy tokens and beams equal, prompt and decode
logprobs within the 16-bit activations' promise, weights resident at about the file's size. One file: the
float32 reference takes seconds to load, once per test worker."""

import collections
import os

import pytest
import torch
from conftest import hf_beam_search

from pagedserve import LLM, BeamSearchParams, SamplingParams
from pagedserve.sampling_params import RequestOutputKind

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village, there lived a very curious cat who",
    "<|im_start|>user\nList three colours.<|im_end|>\n<|im_start|>assistant\n",
]


def test_default_model_greedy_matches_hf(default_llm: LLM, default_hf_model) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = default_llm.generate(PROMPTS, params, use_tqdm=False)
    for output in outputs:
        ids = torch.tensor([output.prompt_token_ids])
        expected = default_hf_model.generate(
            ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert output.outputs[0].token_ids == expected[0, ids.shape[1] :].tolist(), output.prompt
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


def test_gguf_is_kept_quantized_by_default(default_llm: LLM, default_model: str) -> None:
    assert default_llm.llm_engine.config.model.quantization == "gguf"
    weights = default_llm.llm_engine.engine_core.executor.determine_kv_memory()[0].weights_bytes  # rank 0
    assert weights <= 1.2 * os.path.getsize(default_model), (weights, os.path.getsize(default_model))


def test_the_lm_head_gives_the_greedy_tokens_with_its_logits(default_llm: LLM) -> None:
    """The embedded model's LM head (its GGUF Q8_0 blocks, packed) finds each row's argmax in its matmul, so a
    greedy step never reads the logits again: the tokens come with the logits, and are their argmax."""
    model = default_llm.llm_engine.engine_core.executor.worker.model_runner.model
    hidden = torch.randn(64, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits, tokens = model.compute_logits_and_greedy(hidden)
        assert tokens is not None, "the packed head's kernel folds the argmax in"
        assert torch.equal(tokens, logits.argmax(dim=-1))
        assert torch.equal(logits, model.compute_logits(hidden))


def _assert_the_16_bit_promise(steps: list, expected: torch.Tensor, prompt: str) -> None:
    """16-bit activation blocks (PAGEDSERVE_GGUF_ACTIVATION_BITS' default, prefill and decode alike): every
    returned logprob within 2e-3 of max(|reference|, 1), and the largest error within 1e-3 of the largest
    |reference| (docs/quantization.md). expected[i]: the reference log-probabilities of step i's distribution.
    NOTE: per value, 16-bit blocks next to SmolLM2's outlier channels measured 3e-4 to 1.6e-3 over the greedy
    paths these prompts have taken (exact float32 activations: ~1.5e-5)."""
    pairs = [
        (value.logprob, expected[position, token].item())
        for position, logprobs in enumerate(steps)
        for token, value in logprobs.items()
    ]
    worst = max(abs(got - reference) / max(abs(reference), 1.0) for got, reference in pairs)
    assert worst < 2e-3, f"{prompt!r}: relative logprob error {worst:.2e}"
    largest_error = max(abs(got - reference) for got, reference in pairs)
    largest = max(abs(reference) for _, reference in pairs)
    assert largest_error < 1e-3 * largest, f"{prompt!r}: {largest_error:.2e} of {largest:.2f}"


def _reference_logprobs(default_hf_model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(default_hf_model(torch.tensor([token_ids])).logits[0].double(), dim=-1)


def test_prompt_logprobs_match_the_dequantized_model(default_llm: LLM, default_hf_model) -> None:
    """The prompts' logprobs, from one prefill step of all four (AMX tiles where the CPU has them)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=5)
    for output in default_llm.generate(PROMPTS, params, use_tqdm=False):
        expected = _reference_logprobs(default_hf_model, output.prompt_token_ids)
        _assert_the_16_bit_promise(output.prompt_logprobs[1:], expected, output.prompt)


def test_decode_logprobs_match_the_dequantized_model(default_llm: LLM, default_hf_model) -> None:
    """Decode steps (the prompts decode together: batch 4)."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=5)
    for output in default_llm.generate(PROMPTS, params, use_tqdm=False):
        completion = output.outputs[0]
        expected = _reference_logprobs(default_hf_model, output.prompt_token_ids + completion.token_ids)
        steps = expected[len(output.prompt_token_ids) - 1 :]
        _assert_the_16_bit_promise(completion.logprobs, steps, output.prompt)


def test_logprobs_do_not_depend_on_what_shares_the_batch(default_llm: LLM) -> None:
    """Each prompt alone (a prefill of 5-18 rows, then decode steps of one) and all four together (one
    prefill of ~45 rows, decode steps of four): the same tokens and the same logprob bits, prompt and decode."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3, prompt_logprobs=3)

    def values(output) -> list:
        steps = output.prompt_logprobs[1:] + output.outputs[0].logprobs
        return [{token: getattr(value, "logprob", value) for token, value in step.items()} for step in steps]

    together = default_llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, batched in zip(PROMPTS, together):
        (alone,) = default_llm.generate([prompt], params, use_tqdm=False)
        assert alone.outputs[0].token_ids == batched.outputs[0].token_ids, prompt
        assert values(alone) == values(batched), prompt


def test_final_only_requests_report_at_their_first_token_and_their_end(
    default_llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LLM.generate's requests (final-only, no stop strings or logprobs) come back from the engine core at
    their first token and at their end only, with the text and tokens of the same request streamed
    (cumulative, which comes back every step); a request with a stop string comes back every step."""
    engine = default_llm.llm_engine
    outputs_of: collections.Counter[str] = collections.Counter()
    client_step = engine.client.step

    def counting_step():
        core_outputs = client_step()
        outputs_of.update(output.request_id for output in core_outputs.outputs)
        return core_outputs

    monkeypatch.setattr(engine.client, "step", counting_step)
    final, cumulative = RequestOutputKind.FINAL_ONLY, RequestOutputKind.CUMULATIVE
    kinds = {
        "final": SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, output_kind=final),
        "stream": SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, output_kind=cumulative),
        "stop": SamplingParams(
            temperature=0.0, max_tokens=12, ignore_eos=True, output_kind=final, stop="ZZZ"
        ),
    }
    for request_id, params in kinds.items():
        engine.add_request(request_id, "The capital of France is", params)
    finals = {}
    while engine.has_unfinished_requests():
        finals.update((output.request_id, output) for output in engine.step() if output.finished)
    assert outputs_of == {"final": 2, "stream": 12, "stop": 12}
    streamed = finals["stream"].outputs[0]
    for request_id in ("final", "stop"):
        final = finals[request_id].outputs[0]
        assert (final.token_ids, final.text, final.finish_reason) == (
            streamed.token_ids,
            streamed.text,
            "length",
        )
    # NOTE: the three sampled their first token in the same step: its time, not the end's
    assert finals["final"].metrics["first_token_time"] == finals["stream"].metrics["first_token_time"]
