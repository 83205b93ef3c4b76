"""Pythonic (Llama 3.2 / 4 style): the output is a Python list of calls, `[f(a=1, b="x"), g()]`, with
literal keyword arguments."""

import ast

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser, arguments_json

# What Python's parser raises on hostile text: a syntax error, a null byte (ValueError), or nesting past its
# limits (RecursionError, and MemoryError for its stack: `-` repeated 100000 times).
_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError)


class PythonicToolParser(ToolParser):
    start = "["

    def find_start(self, text: str) -> int:
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith("[") else -1

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        try:
            tree = ast.parse(tool_text.strip(), mode="eval").body
        except _PARSE_ERRORS:
            return None
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = [call for node in tree.elts if (call := _call(node)) is not None]
        return calls if len(calls) == len(tree.elts) else None


def _call(node: ast.expr) -> ParsedToolCall | None:
    """`name(key=literal, ...)` -> a call; None for anything else, and for a literal JSON cannot carry
    (bytes, a set, 1e999, ...)."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    if any(keyword.arg is None for keyword in node.keywords):  # **kwargs
        return None
    try:
        arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords}
    except (*_PARSE_ERRORS, TypeError):  # TypeError: an unhashable key, {[1]: 2}
        return None
    text = arguments_json(arguments)
    return None if text is None else ParsedToolCall(node.func.id, text)
