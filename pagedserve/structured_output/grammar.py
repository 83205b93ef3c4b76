"""StructuredOutputsParams -> an llguidance grammar, and its validation (the 400 a bad schema gets).

Why llguidance rather than xgrammar (benchmarks/grammar_backends.py, docs/benchmarks.md): on this
CPU it compiles a JSON schema ~3x faster cold, its masks (~30 µs per token at vocab 49152) are far below a
step's time, its API fills numpy bitmasks (the scheduler process stays free of torch, as the layering
wants), and its parser runs under fuel limits (`LLParserLimits`): a hostile schema or grammar gets an error
in bounded time instead of stalling the engine. xgrammar's masks are faster (~2 µs) but need torch tensors.
"""

import json
import re
from typing import TYPE_CHECKING, NoReturn

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark
from tokenizers import Tokenizer

from pagedserve.errors import InvalidRequestError
from pagedserve.structured_output.emptiness import json_schema_emptiness, lark_emptiness
from pagedserve.structured_output.json_bounds import bounded_json_object, bounded_schema
from pagedserve.structured_outputs_params import StructuredOutputsParams
from pagedserve.utils.light_tokenizer import backend_json
from pagedserve.utils.user_json import JsonValue, nests_deeper_than

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Compact JSON (no free whitespace between tokens): a small model cannot loop on spaces and newlines.
_JSON_OPTIONS: "JsonCompileOptions" = {"whitespace_flexible": False}
# llguidance's own defaults bound each compile and each mask step (fuel); spelled out to keep them visible.
PARSER_LIMITS = llguidance.LLParserLimits(
    initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, max_grammar_size=500_000
)
DEFAULT_MAX_SPEC_BYTES = 64 * 1024
# How deep a constraint may nest: objects and arrays in a JSON schema (each property takes 2 levels:
# "properties", then its schema), groups in a GBNF grammar. Checked before anything walks the constraint:
# those walks recurse (Python stops at ~1000 frames) and llguidance's JSON reader stops at 128 levels.
# Schemas in practice nest a few levels; Lark grammars nest ~25 groups at most in llguidance.
MAX_CONSTRAINT_DEPTH = 100
# What in GBNF may hold a parenthesis that opens no group: "strings", [character classes], # comments.
_GBNF_PARENTHESES = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|[()]')


def make_ll_tokenizer(tokenizer: object, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of the model's tokenizer (~1 s to build: build once): a transformers fast
    tokenizer or the API server's LightTokenizer, read through their `tokenizers` backend (not through
    llguidance.hf, which imports transformers). `vocab_size`: the model's logits width, so the bitmask has
    one bit per logit. A slow tokenizer raises ValueError (as llguidance would)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise ValueError("Only fast tokenizers are supported")
    eos: int | None = getattr(tokenizer, "eos_token_id", None)
    return llguidance.LLTokenizer(backend_json(backend), n_vocab=vocab_size, eos_token=eos)


def closed_objects(schema: JsonValue) -> JsonValue:
    """`schema` with `"additionalProperties": false` on every object schema that does not say otherwise,
    as xgrammar's strict mode (vLLM's default) and OpenAI's strict structured outputs do. NOTE: left open, a
    small model fills the output with invented keys until max_tokens instead of closing the object. The
    result still validates against the original schema (it allows a subset)."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: closed_objects(value) for key, value in schema.items()}
    if (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
        closed["additionalProperties"] = False
    return closed


def to_grammar(params: StructuredOutputsParams) -> str:
    """The llguidance grammar of one constraint (JSON with closed objects and bounded values, see
    json_bounds.py). Raises InvalidRequestError for a malformed JSON schema
    (llguidance checks the rest when the grammar is validated or compiled)."""
    if params.json_object:
        return llguidance.LLMatcher.grammar_from_json_schema(bounded_json_object(), defaults=_JSON_OPTIONS)
    if params.json is not None:
        schema = closed_objects(params.json)
        assert isinstance(schema, dict), "StructuredOutputsParams holds a JSON schema as an object"
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(
                bounded_schema(schema), defaults=_JSON_OPTIONS
            )
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(
                f"structured_outputs.json is not a valid JSON schema: {exc}", param="structured_outputs.json"
            ) from exc
    if params.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(params.regex)
    if params.choice is not None:
        # Lark string literals take JSON escapes: any choice text is matched literally.
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(choice) for choice in params.choice)
        )
    assert params.grammar is not None, "StructuredOutputsParams holds exactly one constraint"
    return llguidance.LLMatcher.grammar_from_lark(_lark(params.grammar))


def _is_gbnf(grammar: str) -> bool:
    return "::=" in grammar  # GBNF (llama.cpp's, also what vLLM's xgrammar backend takes); else Lark


def _lark(grammar: str) -> str:
    """The grammar in llguidance's Lark, converted from GBNF if need be. Raises InvalidRequestError."""
    if not _is_gbnf(grammar):
        return grammar
    try:
        return gbnf_to_lark(grammar)
    except Exception as exc:  # GbnfToLarkError, and a plain Exception for an undefined rule
        raise InvalidRequestError(
            f"structured_outputs.grammar is not valid GBNF: {exc}", param="structured_outputs.grammar"
        ) from exc


def check_schema_depth(schema: object, param: str, limit: int = MAX_CONSTRAINT_DEPTH) -> None:
    """Raises InvalidRequestError (400, naming `param`) when objects and arrays in `schema` nest more than
    `limit` levels deep."""
    if nests_deeper_than(schema, limit):
        _too_deep(param, "objects and arrays", limit, "move nested subschemas to $defs and $ref them")


def _gbnf_depth(grammar: str) -> int:
    """How deep groups (parentheses) nest in a GBNF grammar; measured without recursion."""
    depth = deepest = 0
    for match in _GBNF_PARENTHESES.finditer(grammar):
        if match.group() == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif match.group() == ")":
            depth -= 1
    return deepest


def _too_deep(param: str, what: str, limit: int, remedy: str) -> NoReturn:
    raise InvalidRequestError(
        f"{param} is nested too deeply: its {what} nest more than the limit of {limit} levels. "
        f"Flatten it: {remedy}.",
        param=param,
    )


def _check_depth(params: StructuredOutputsParams) -> None:
    """Refuses a JSON schema or GBNF grammar nested past MAX_CONSTRAINT_DEPTH (Lark: llguidance's limit)."""
    if params.json is not None:
        check_schema_depth(params.json, "structured_outputs.json")
    elif params.grammar is not None and _is_gbnf(params.grammar):
        if _gbnf_depth(params.grammar) > MAX_CONSTRAINT_DEPTH:
            remedy = "move inner groups into rules of their own"
            _too_deep("structured_outputs.grammar", "groups (parentheses)", MAX_CONSTRAINT_DEPTH, remedy)


def _emptiness(params: StructuredOutputsParams) -> str | None:
    """Why a constraint llguidance accepted can produce no output at all (emptiness.py), or None."""
    if params.json is not None:
        return json_schema_emptiness(params.json)
    if params.grammar is not None:
        return lark_emptiness(_lark(params.grammar), gbnf=_is_gbnf(params.grammar))
    return None  # json_object, regex, choice: llguidance's own checks


def validate(
    params: StructuredOutputsParams,
    tokenizer: llguidance.LLTokenizer,
    max_spec_bytes: int = DEFAULT_MAX_SPEC_BYTES,
) -> None:
    """Raises InvalidRequestError: 400 when the spec nests deeper than MAX_CONSTRAINT_DEPTH (checked first:
    everything after walks it recursively), 413 when it is longer than `max_spec_bytes`
    (--max-structured-output-bytes), 400 with llguidance's message when it does not compile, or when it
    can produce no output at all (a recursion that never ends: llguidance would accept it and the request
    would dead-end while it runs)."""
    _check_depth(params)
    size = len(params.spec.encode())
    if size > max_spec_bytes:
        raise InvalidRequestError(
            f"The {params.kind} constraint is {size} bytes, more than this server takes ({max_spec_bytes}, "
            "--max-structured-output-bytes).",
            param=f"structured_outputs.{params.kind}",
            status_code=413,
        )
    compile_error = llguidance.LLMatcher.validate_grammar(to_grammar(params), tokenizer, limits=PARSER_LIMITS)
    error = compile_error or _emptiness(params)
    if error:
        raise InvalidRequestError(
            f"Invalid structured_outputs.{params.kind}: {error}", param=f"structured_outputs.{params.kind}"
        )
