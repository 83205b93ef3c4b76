"""`tools` and `tool_choice` on /v1/chat/completions: what constrains the output, and how the output
becomes `tool_calls` (whole, or as stream deltas).

- "none": tools are rendered, the output is plain content.
- "required" / a named function: the output is constrained (a JSON schema) to valid calls, then read.
- "auto": the model writes what it likes; the server's --tool-call-parser finds the calls in its text.

parallel_tool_calls false: at most one call per choice (required: the schema allows one; auto: the first
the parser finds).
"""

from dataclasses import dataclass
from typing import Any, Protocol

from pagedserve.entrypoints.openai.tool_parsers import ParsedToolCall, ToolParser, get_tool_parser
from pagedserve.entrypoints.openai.tool_parsers.base import call_from_json, load_json
from pagedserve.entrypoints.openai.tool_parsers.streaming import ToolCallDelta, ToolCallStreamer, call_delta
from pagedserve.errors import InvalidRequestError
from pagedserve.structured_output.grammar import MAX_CONSTRAINT_DEPTH, check_schema_depth
from pagedserve.structured_outputs_params import StructuredOutputsParams
from pagedserve.utils.user_json import JsonObject, JsonValue


@dataclass
class ToolOutput:
    content: str | None
    tool_calls: list[ParsedToolCall]
    finish_reason: str | None  # replaces the engine's "stop" when the output is tool calls


class ToolStreamer(Protocol):
    @property
    def has_tool_calls(self) -> bool: ...

    def feed(self, delta: str, finished: bool) -> tuple[str, list[ToolCallDelta]]: ...


@dataclass
class ChatTools:
    """One request's tool handling. `mode`: none | auto (with `parser`) | required | named (`named`)."""

    mode: str
    functions: dict[str, JsonObject]  # name -> the function's JSON schema of parameters
    named: str | None = None
    parser: ToolParser | None = None
    parallel: bool = True  # parallel_tool_calls: false keeps one call (the first)

    @property
    def constraint(self) -> StructuredOutputsParams | None:
        if self.named is not None:
            return StructuredOutputsParams(json=self.functions[self.named])
        if self.mode == "required":
            return StructuredOutputsParams(json=_required_schema(self.functions, self.parallel))
        return None

    def output(self, text: str, finish_reason: str | None) -> ToolOutput:
        if self.named is not None:
            return ToolOutput(None, [ParsedToolCall(self.named, text)], finish_reason)
        if self.mode == "required":
            calls = self._kept(_required_calls(text))
            return ToolOutput(None, calls, self.finish_reason(finish_reason, bool(calls)))
        if self.parser is not None:
            extracted = self.parser.extract(text)
            calls = self._kept(extracted.tool_calls)
            return ToolOutput(extracted.content, calls, self.finish_reason(finish_reason, bool(calls)))
        return ToolOutput(text, [], finish_reason)

    def _kept(self, calls: list[ParsedToolCall]) -> list[ParsedToolCall]:
        return calls if self.parallel else calls[:1]

    def finish_reason(self, engine_reason: str | None, has_tool_calls: bool) -> str | None:
        """OpenAI's: "tool_calls" when the model chose to call (auto, required); a forced named call and
        plain content keep the engine's reason."""
        if engine_reason == "stop" and has_tool_calls and self.mode in ("auto", "required"):
            return "tool_calls"
        return engine_reason

    def streamer(self) -> ToolStreamer | None:
        if self.named is not None:
            return _NamedStreamer(self.named)
        streamer: ToolStreamer | None = _RequiredStreamer() if self.mode == "required" else None
        if self.parser is not None:
            streamer = ToolCallStreamer(self.parser)
        return streamer if streamer is None or self.parallel else _FirstCallStreamer(streamer)


def resolve_chat_tools(
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    auto_parser: str | None,
    parallel: bool = True,
) -> ChatTools:
    """Raises InvalidRequestError for malformed tools, an unknown named function, or "auto" on a server
    started without --enable-auto-tool-choice --tool-call-parser. `parallel`: parallel_tool_calls."""
    functions = _functions(tools or [])
    if tool_choice is not None and tool_choice != "none" and not functions:
        raise InvalidRequestError(
            "tool_choice needs tools: list the functions the model may call.", param="tool_choice"
        )
    if tool_choice is None:
        tool_choice = "auto" if functions and auto_parser else "none"
    if tool_choice == "none":
        return ChatTools("none", functions)
    if tool_choice == "auto":
        if auto_parser is None:
            raise InvalidRequestError(
                '"auto" tool choice needs the server started with --enable-auto-tool-choice '
                "and --tool-call-parser.",
                param="tool_choice",
            )
        return ChatTools("auto", functions, parser=get_tool_parser(auto_parser, functions), parallel=parallel)
    if tool_choice == "required":
        return ChatTools("required", functions, parallel=parallel)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or name is None:
        raise InvalidRequestError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", '
            '"function": {"name": ...}}.',
            param="tool_choice",
        )
    if name not in functions:
        raise InvalidRequestError(
            f"tool_choice names function {name!r}, which is not in tools ({', '.join(functions)}).",
            param="tool_choice",
        )
    return ChatTools("named", functions, named=name)


# How deep _required_schema puts each tool's parameters: under $defs, then tool<i>.
_REQUIRED_WRAPPING = 2


def _functions(tools: list[dict[str, Any]]) -> dict[str, JsonObject]:
    functions: dict[str, JsonObject] = {}
    indexes: dict[str, int] = {}
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise InvalidRequestError(
                f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'parameters': {...}}}.",
                param=f"tools[{index}]",
            )
        name = function["name"]
        if name in indexes:
            raise InvalidRequestError(
                f"tools[{index}].function.name {name!r} is also the name of tools[{indexes[name]}]: "
                "each tool needs its own name; rename or drop one.",
                param=f"tools[{index}].function.name",
            )
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise InvalidRequestError(
                f"tools[{index}].function.parameters must be a JSON schema object.",
                param=f"tools[{index}].function.parameters",
            )
        # NOTE: checked before _rebased walks it (recursively), with room for where it goes in
        # _required_schema: the whole schema is checked against MAX_CONSTRAINT_DEPTH again.
        check_schema_depth(
            parameters, f"tools[{index}].function.parameters", MAX_CONSTRAINT_DEPTH - _REQUIRED_WRAPPING
        )
        functions[name], indexes[name] = parameters, index
    return functions


def _required_schema(functions: dict[str, JsonObject], parallel: bool = True) -> JsonObject:
    """A JSON array of at least one (exactly one unless `parallel`) {"name": <a tool>, "parameters": <its
    arguments>} (vLLM's form). Each
    tool's parameters schema moves whole under the root's $defs, its local $refs rebased there ("#/$defs/X"
    -> "#/$defs/tool0/$defs/X", "#" -> "#/$defs/tool0"): every ref resolves as it did in the tool's own
    schema."""
    defs = {f"tool{i}": _rebased(schema, f"#/$defs/tool{i}") for i, schema in enumerate(functions.values())}
    calls: list[JsonValue] = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [name]},
                "parameters": {"$ref": f"#/$defs/tool{i}"},
            },
            "required": ["name", "parameters"],
        }
        for i, name in enumerate(functions)
    ]
    schema: JsonObject = {"type": "array", "minItems": 1, "items": {"anyOf": calls}, "$defs": defs}
    return schema if parallel else {**schema, "maxItems": 1}


# Keywords whose values are JSON data, not schemas: a "$ref" key in them is not a reference.
_DATA_KEYWORDS = ("const", "enum", "default", "examples")


def _rebased(schema: JsonValue, base: str) -> JsonValue:
    """`schema` with each local $ref ("#...") under `base` instead of "#"."""
    if isinstance(schema, list):
        return [_rebased(item, base) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rebased: JsonObject = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rebased[key] = base + value[1:]
        else:
            rebased[key] = value if key in _DATA_KEYWORDS else _rebased(value, base)
    return rebased


def _required_calls(text: str) -> list[ParsedToolCall]:
    """The calls of a required tool choice's output; none when it was cut short (max_tokens: the finish
    reason says so)."""
    try:
        calls = load_json(text)
    except ValueError:
        return []
    found = [call_from_json(call, "parameters") for call in calls] if isinstance(calls, list) else []
    return [call for call in found if call is not None]


class _FirstCallStreamer:
    """parallel_tool_calls false: only the first call's deltas go out."""

    def __init__(self, inner: ToolStreamer) -> None:
        self.inner = inner

    @property
    def has_tool_calls(self) -> bool:
        return self.inner.has_tool_calls

    def feed(self, delta: str, finished: bool) -> tuple[str, list[ToolCallDelta]]:
        content, calls = self.inner.feed(delta, finished)
        return content, [call for call in calls if call.index == 0]


class _NamedStreamer:
    """The constrained output *is* the arguments: they stream as they come, the first with the name."""

    has_tool_calls = True

    def __init__(self, name: str) -> None:
        self.call = ParsedToolCall(name, "")
        self.started = False

    def feed(self, delta: str, finished: bool) -> tuple[str, list[ToolCallDelta]]:
        if not self.started:
            self.started = True
            return "", [ToolCallDelta(0, self.call.id, self.call.name, delta)]
        return "", [ToolCallDelta(0, arguments=delta)] if delta else []


class _RequiredStreamer:
    """The calls are known when the array closes: they go out at the end."""

    has_tool_calls = True

    def __init__(self) -> None:
        self.text = ""

    def feed(self, delta: str, finished: bool) -> tuple[str, list[ToolCallDelta]]:
        self.text += delta
        if not finished:
            return "", []
        return "", [call_delta(i, call) for i, call in enumerate(_required_calls(self.text))]
