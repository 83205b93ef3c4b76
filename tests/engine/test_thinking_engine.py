"""A thinking model on the engine (--reasoning-parser qwen3, a tiny random Qwen3 whose tokenizer has
<think> and </think>): thinking_token_budget forces </think> after that many thinking tokens and the
model's own greedy continuation follows (HF transformers is the reference); a JSON schema constrains
only what follows </think> (or the whole output when the prompt closed thinking); n-gram speculation,
whose drafts cross the forced position and the end of thinking, gives the same tokens."""

import json

import jsonschema
import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.errors import InvalidRequestError
from pagedserve.outputs import CompletionOutput
from pagedserve.sampling_params import BeamSearchParams
from pagedserve.structured_outputs_params import StructuredOutputsParams

THINK, END = 49152, 49153  # conftest.add_think_tokens
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
ENGINE = dict(reasoning_parser="qwen3", max_model_len=96, num_gpu_blocks_override=48, block_size=8)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def think_model(tiny_model_factory) -> str:
    return tiny_model_factory("qwen3-think")


@pytest.fixture(scope="module")
def llm(think_model: str) -> LLM:
    return LLM(think_model, **ENGINE)


@pytest.fixture(scope="module")
def ngram_llm(think_model: str) -> LLM:
    return LLM(think_model, speculative_config=NGRAM, **ENGINE)


def _outputs(llm: LLM) -> list[CompletionOutput]:
    prompts, params = _cases()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outputs]


@pytest.fixture(scope="module")
def plain(llm: LLM) -> list[CompletionOutput]:
    """The cases' outputs, run once for the module."""
    return _outputs(llm)


def _hf_greedy(model, prompt: list[int], num: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=num, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


# Prompts: the block opened by the prompt (DeepSeek-R1 / Qwen3-2507 templates); no tag, the bias writes
# <think> (Qwen3); the block closed by the prompt (enable_thinking false). Repeated <think> tokens give
# the n-gram proposer drafts of <think> at the forced position.
OPENED = [11, 12, 13, THINK]
UNTAGGED = [THINK, THINK, 11, 12, THINK, THINK, THINK, 5]  # its last tag <think>: thinking
CLOSED = [11, 12, THINK, 13, END, 14]


def _cases() -> tuple[list[list[int]], list[SamplingParams]]:
    greedy = dict(temperature=0.0, max_tokens=14)
    constrained = StructuredOutputsParams(json=SCHEMA)
    return [OPENED, OPENED, [11, 12, 13], UNTAGGED, CLOSED], [
        SamplingParams(**greedy, thinking_token_budget=4),
        SamplingParams(**greedy, thinking_token_budget=0),
        SamplingParams(
            **greedy, thinking_token_budget=3, logit_bias={THINK: 100}, structured_outputs=constrained
        ),
        SamplingParams(
            **greedy, thinking_token_budget=2, logit_bias={THINK: 100}, structured_outputs=constrained
        ),
        SamplingParams(**greedy, logit_bias={THINK: 100}, structured_outputs=constrained),
    ]


def test_budget_forces_the_end_of_thinking_then_the_model_goes_on(
    plain: list[CompletionOutput], think_model: str
) -> None:
    from transformers import AutoModelForCausalLM

    budget4, budget0 = (list(output.token_ids) for output in plain[:2])
    assert END not in budget4[:4] and budget4[4] == END
    assert budget0[0] == END
    hf = AutoModelForCausalLM.from_pretrained(think_model, dtype=torch.float32)
    assert budget4[:4] == _hf_greedy(hf, OPENED, 4)  # thinking: the model's own greedy tokens
    assert budget4[5:] == _hf_greedy(hf, OPENED + budget4[:5], len(budget4) - 5)  # then it answers


def test_grammar_applies_from_the_end_of_thinking(plain: list[CompletionOutput]) -> None:
    untagged, opened, closed = plain[2:]
    # The bias keeps writing <think>: a leading one opens the block (or is the tag of the block the prompt
    # opened: not counted), then 3 (2) thinking tokens.
    assert untagged.token_ids[:5] == [THINK] * 4 + [END]
    assert opened.token_ids[:4] == [THINK] * 3 + [END]
    for output in (untagged, opened):
        jsonschema.validate(json.loads(output.text.split("</think>", 1)[1]), SCHEMA)
    assert THINK not in closed.token_ids  # the prompt closed thinking: the grammar from the first token
    jsonschema.validate(json.loads(closed.text), SCHEMA)


def test_ngram_speculation_gives_the_same_tokens(plain: list[CompletionOutput], ngram_llm: LLM) -> None:
    assert [o.token_ids for o in _outputs(ngram_llm)] == [o.token_ids for o in plain]


def test_budget_needs_sampled_tokens(llm: LLM) -> None:
    """A beam search picks its continuations itself: no budget can be forced on it."""
    with pytest.raises(InvalidRequestError, match="beam search") as error:
        llm.llm_engine.add_request(
            "beam",
            {"prompt_token_ids": OPENED},
            SamplingParams(thinking_token_budget=2),
            beam_search=BeamSearchParams(2, 4),
        )
    assert error.value.param == "thinking_token_budget"
