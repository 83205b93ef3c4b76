"""Structured outputs through `LLM` with SmolLM2: every output parses and validates (jsonschema), greedy
and sampled; regex, choice and an arithmetic EBNF grammar match; n > 1 with seeds."""

import json
import re

import jsonschema
import pytest
from schemas import SCHEMAS, prompt_for

from pagedserve import LLM, SamplingParams
from pagedserve.errors import InvalidRequestError
from pagedserve.structured_outputs_params import StructuredOutputsParams

ARITHMETIC_GBNF = r"""
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9] | [1-9] [0-9] | [1-9] [0-9] [0-9]
"""
ARITHMETIC = re.compile(r"^(?:\d+|[()+\-*/])+$")


@pytest.fixture(scope="module")
def llm(default_model: str) -> LLM:
    return LLM(default_model, kv_cache_memory="128MiB", max_model_len=1024, max_num_seqs=32)


def _constrained(**kind) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=120, structured_outputs=StructuredOutputsParams(**kind))


@pytest.mark.sampled
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_schema_output_validates(llm: LLM, temperature: float) -> None:
    params = [
        SamplingParams(
            temperature=temperature,
            seed=7,
            max_tokens=160,
            structured_outputs=StructuredOutputsParams(json=schema),
        )
        for _, schema in SCHEMAS
    ]
    outputs = llm.chat([prompt_for(description) for description, _ in SCHEMAS], params, use_tqdm=False)
    for (description, schema), output in zip(SCHEMAS, outputs):
        sample = output.outputs[0]
        assert sample.finish_reason == "stop", (description, sample.text)
        jsonschema.validate(json.loads(sample.text), schema)


def test_regex_choice_and_grammar(llm: LLM) -> None:
    question = [{"role": "user", "content": "Is the sky blue? Then give a phone number and a sum."}]
    cases = [
        (dict(regex=r"\d{3}-\d{4}"), lambda text: re.fullmatch(r"\d{3}-\d{4}", text)),
        (dict(choice=["yes", "no", "maybe so"]), lambda text: text in ("yes", "no", "maybe so")),
        (dict(grammar=ARITHMETIC_GBNF), lambda text: ARITHMETIC.match(text) and _evaluates(text)),
        (
            dict(grammar='start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]{1,3}/'),
            lambda text: re.fullmatch(r"\(\d{1,3}(\+\d{1,3})*\)", text),
        ),
    ]
    outputs = llm.chat([question] * len(cases), [_constrained(**kind) for kind, _ in cases], use_tqdm=False)
    for (kind, matches), output in zip(cases, outputs):
        text = output.outputs[0].text
        assert output.outputs[0].finish_reason == "stop" and matches(text), (kind, text)


def test_json_object_closes_and_parses(llm: LLM) -> None:
    """json_object is bounded (json_bounds.py: 8 keys of 32 characters, 4 levels), so even a model that
    repeats one key (greedy SmolLM2 does here: JSON keys are not deduplicated by the grammar) must close
    the object: within 400 tokens on both prompts."""
    questions = [
        [{"role": "user", "content": "Is the sky blue? Then give a phone number and a sum."}],
        [{"role": "user", "content": "Describe the weather in Paris as a JSON object."}],
    ]
    params = SamplingParams(
        temperature=0.0, max_tokens=400, structured_outputs=StructuredOutputsParams(json_object=True)
    )
    for output in llm.chat(questions, params, use_tqdm=False):
        sample = output.outputs[0]
        assert sample.finish_reason == "stop", sample.text
        assert isinstance(json.loads(sample.text), dict)


def _evaluates(expression: str) -> bool:
    try:
        eval(expression, {"__builtins__": {}})  # noqa: S307 - digits and operators only (checked above)
    except ZeroDivisionError:
        pass
    return True


def test_parallel_samples_with_seeds_are_valid_and_reproducible(llm: LLM) -> None:
    schema = SCHEMAS[4][1]
    params = SamplingParams(
        n=3, temperature=1.0, seed=11, max_tokens=80, structured_outputs=StructuredOutputsParams(json=schema)
    )
    first = llm.chat(prompt_for(SCHEMAS[4][0]), params, use_tqdm=False)[0]
    again = llm.chat(prompt_for(SCHEMAS[4][0]), params, use_tqdm=False)[0]
    assert [o.text for o in first.outputs] == [o.text for o in again.outputs]
    for sample in first.outputs:
        jsonschema.validate(json.loads(sample.text), schema)


def test_invalid_constraints_are_refused_with_the_engine_message(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="exactly one of"):
        StructuredOutputsParams(json={"type": "object"}, regex="a+")
    with pytest.raises(InvalidRequestError, match="exactly one of"):
        StructuredOutputsParams()
    with pytest.raises(InvalidRequestError, match="minItems"):
        llm.generate("x", _constrained(json={"type": "array", "minItems": 3, "maxItems": 1}), use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="unclosed"):
        llm.generate("x", _constrained(regex="[a-"), use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="GBNF"):
        llm.generate("x", _constrained(grammar="root ::= ("), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
