"""Reasoning parsers (--reasoning-parser, vLLM's names): split a thinking model's output into its reasoning
and its answer, whole or as it streams. Text only: no torch, no tokenizer."""

from pagedserve.reasoning.parser import ReasoningParser, ReasoningStream
from pagedserve.reasoning.parsers import REASONING_PARSERS, ReasoningParserName, get_reasoning_parser

__all__ = [
    "REASONING_PARSERS",
    "ReasoningParser",
    "ReasoningParserName",
    "ReasoningStream",
    "get_reasoning_parser",
]
