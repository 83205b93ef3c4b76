"""Pythonic (Llama 3.2 / 4 style): the output is a Python list of calls, `[f(a=1, b="x"), g()]`, with
literal keyword arguments."""

import ast
import json

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser


class PythonicToolParser(ToolParser):
    start = "["

    def find_start(self, text: str) -> int:
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith("[") else -1

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        try:
            tree = ast.parse(tool_text.strip(), mode="eval").body
        except SyntaxError:
            return None
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None
            try:
                arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
            except ValueError:
                return None
            calls.append(ParsedToolCall(node.func.id, json.dumps(arguments, ensure_ascii=False)))
        return calls
