"""Constraints that can produce no output: refused at validation (a 400) when the productivity analysis
(emptiness.py) proves it, and otherwise ended at run time with finish_reason "error" and the reason, never
passed off as a completed output ("stop")."""

from concurrent.futures import Future

import llguidance
import pytest
from llguidance.gbnf_to_lark import gbnf_to_lark
from transformers import AutoTokenizer

from pagedserve import LLM, SamplingParams
from pagedserve.errors import InvalidRequestError
from pagedserve.structured_output.emptiness import json_schema_emptiness, lark_emptiness
from pagedserve.structured_output.grammar import make_ll_tokenizer, to_grammar, validate
from pagedserve.structured_output.matcher import RequestGrammar
from pagedserve.structured_outputs_params import StructuredOutputsParams
from pagedserve.utils.default_model import default_model_path
from pagedserve.utils.gguf_cache import gguf_hf_folder

SELF_REQUIRED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
NODE = {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}}}

DEAD_SCHEMAS = [
    (SELF_REQUIRED, ["#"]),
    ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, ["#"]),
    ({"allOf": [{"$ref": "#"}]}, ["#"]),
    ({"type": "array", "prefixItems": [{"type": "null"}, {"$ref": "#"}], "minItems": 2}, ["#"]),
    (  # through a chain of $defs, and a required linked-list `next`
        {"$defs": {"node": {**NODE, "required": ["v", "next"]}}, "$ref": "#/$defs/node"},
        ["#/$defs/node"],
    ),
    (
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/x"}},
            "required": ["a"],
            "$defs": {"x": {"anyOf": [{"$ref": "#/$defs/y"}]}, "y": {"$ref": "#"}},
        },
        ["#", "#/$defs/x", "#/$defs/y"],
    ),
]
LIVE_SCHEMAS = [
    {"type": "object", "properties": {"a": {"$ref": "#"}}},  # `a` optional
    {"type": ["object", "null"], "properties": {"a": {"$ref": "#"}}, "required": ["a"]},  # null ends it
    {"anyOf": [SELF_REQUIRED, {"type": "null"}]},
    {"type": "array", "items": {"$ref": "#"}},  # [] ends it
    {"properties": {"a": {"$ref": "#"}}, "required": ["a"]},  # untyped: a number is a value too
    {"$defs": {"node": {**NODE, "required": ["v"]}}, "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"a": {"$ref": "https://example.com/s"}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"const": {"$ref": "#"}}}, "required": ["a"]},  # data
]
DEAD_GRAMMARS = [
    ("root ::= root", ["root"]),
    ('root ::= "a" root', ["root"]),
    ('root ::= item+\nitem ::= "(" item ")"', ["item", "root"]),
    ('start: x\nx: y\ny: x | z\nz: "q" z', ["start", "x", "y", "z"]),
    ('start: "a" (start | b)\nb: "b" b', ["b", "start"]),
    ('start: x{2,}\nx: "a" x', ["start", "x"]),
    ('%llguidance {}\nstart: %json {"type": "object"} start', ["start"]),
    ('start.2[lazy]: "a" start', ["start"]),
]
LIVE_GRAMMARS = [
    'root ::= "a" root | "b"',
    'start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]{1,3}/',
    "start: x*\nx: x",  # x is dead but never needed
    "start: [x]\nx: x",
    "start: x{0,3}\nx: x",
    "start: x ~ 0..2\nx: x",
    'start: a\na: a "y"\n    | "x"',  # the alternative on the next line ends it
    'start: a -> alias\na: "x"',
    "start{x}: x",  # templates: not modelled, no verdict
    "start: <[1,2]> | @other",
    'start: %json {"type": "object"}',
]


@pytest.mark.parametrize("schema,dead", DEAD_SCHEMAS)
def test_json_schema_whose_recursion_cannot_end_is_found(schema: dict, dead: list[str]) -> None:
    message = json_schema_emptiness(schema)
    assert message is not None and "no finite JSON value" in message
    for ref in dead:
        assert repr(ref) in message


@pytest.mark.parametrize("schema", LIVE_SCHEMAS)
def test_json_schema_with_a_way_out_passes(schema: dict) -> None:
    assert json_schema_emptiness(schema) is None


@pytest.mark.parametrize("grammar,dead", DEAD_GRAMMARS)
def test_grammar_whose_rules_cannot_end_is_found(grammar: str, dead: list[str]) -> None:
    lark = gbnf_to_lark(grammar) if "::=" in grammar else grammar
    message = lark_emptiness(lark, gbnf="::=" in grammar)
    assert message is not None and message.startswith(f"it produces no string: rule{'s' * (len(dead) > 1)} ")
    for rule in dead:
        assert repr(rule) in message


@pytest.mark.parametrize("grammar", LIVE_GRAMMARS)
def test_grammar_with_a_way_out_passes(grammar: str) -> None:
    assert lark_emptiness(grammar) is None


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    return make_ll_tokenizer(AutoTokenizer.from_pretrained(gguf_hf_folder(default_model_path())), 49152)


@pytest.mark.parametrize(
    "constraint,message",
    [
        (
            StructuredOutputsParams(json=SELF_REQUIRED),
            r"Invalid structured_outputs.json: it allows no finite JSON value: \$ref '#' can never end",
        ),
        (
            StructuredOutputsParams(grammar="root ::= root"),
            "Invalid structured_outputs.grammar: it produces no string: rule 'root' can never end",
        ),
        (
            StructuredOutputsParams(grammar="start: start"),
            "Invalid structured_outputs.grammar: it produces no string: rule 'start' can never end",
        ),
    ],
)
def test_validation_refuses_what_can_produce_nothing(
    tokenizer: llguidance.LLTokenizer, constraint: StructuredOutputsParams, message: str
) -> None:
    """llguidance alone validates these (and its matcher dead-ends at run time)."""
    assert not llguidance.LLMatcher.validate_grammar(to_grammar(constraint), tokenizer)
    with pytest.raises(InvalidRequestError, match=message) as info:
        validate(constraint, tokenizer)
    assert info.value.param == f"structured_outputs.{constraint.kind}" and info.value.status_code == 400


def test_a_rejected_token_is_a_failure_not_a_completion(tokenizer: llguidance.LLTokenizer) -> None:
    compiled: Future[llguidance.LLMatcher] = Future()
    compiled.set_result(
        llguidance.LLMatcher(tokenizer, to_grammar(StructuredOutputsParams(choice=["yes", "no"])))
    )
    grammar = RequestGrammar(compiled)
    assert grammar.ready() and grammar.failure is None
    assert grammar.accept(tokenizer.tokenize_str("maybe")[0])
    assert grammar.failure is not None and grammar.failure.startswith("grammar failed: Parser Error: token")


def test_grammar_that_dead_ends_while_running_finishes_with_error(tiny_llama: str) -> None:
    """A terminal that matches nothing is beyond the static check: after "x" no token may follow and the
    grammar is incomplete. The request ends with finish_reason "error" and says why (it was "stop")."""
    llm = LLM(tiny_llama, max_model_len=128, kv_cache_memory="16MiB")
    dead_end = StructuredOutputsParams(grammar='start: "x" y\ny: /[^\\x00-\\U0010FFFF]/')
    fine = StructuredOutputsParams(choice=["x"])
    outputs = llm.generate(
        ["Say x", "Say x"],
        [SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=c) for c in (dead_end, fine)],
        use_tqdm=False,
    )
    failed, completed = (output.outputs[0] for output in outputs)
    assert failed.text == "x" and failed.finish_reason == "error"
    assert failed.stop_reason == ("grammar failed: no token may follow, and the output does not complete it")
    assert completed.text == "x" and completed.finish_reason == "stop" and completed.stop_reason is None
    with pytest.raises(InvalidRequestError, match="rule 'root' can never end"):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(grammar="root ::= root")))
