"""The model's HF tokenizer, loaded once per process and folder version.

The engine, the structured-output compiler, and the reasoning and pooling configs each need the same
tokenizer; loading one parses its tokenizer.json (megabytes for a 50k vocabulary: a quarter of a second or
more) every time, and an offline `LLM(...)` asked for it up to four times. Callers only read it."""

import functools
import importlib
import os
from typing import TYPE_CHECKING

from pagedserve.utils.gguf_cache import gguf_hf_folder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The files a tokenizer is read from: rewriting one in place loads the tokenizer afresh.
_TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges", "added_tokens")


def tokenizer_source(model: str, tokenizer: str | None, gguf_file: str | None) -> str:
    """Where the tokenizer comes from: --tokenizer, else the GGUF file's converted folder, else the model."""
    return tokenizer or (gguf_hf_folder(gguf_file) if gguf_file else model)


def load_hf_tokenizer(source: str, tokenizer_class: str | None = None) -> "PreTrainedTokenizerBase":
    """The tokenizer at `source`: of `tokenizer_class` ("module:qualname", the class AutoTokenizer picked
    for it elsewhere: importing it alone does not import torch), else the class AutoTokenizer picks."""
    if os.path.isdir(source):
        folder = os.path.realpath(source)
        stamp = tuple(
            sorted(
                (name, os.stat(os.path.join(folder, name)).st_mtime_ns)
                for name in os.listdir(folder)
                if name.startswith(_TOKENIZER_FILES)
            )
        )
        return _load(folder, stamp, tokenizer_class)
    return _load(source, (), tokenizer_class)


@functools.lru_cache(maxsize=8)
def _load(
    source: str, stamp: tuple[tuple[str, int], ...], tokenizer_class: str | None
) -> "PreTrainedTokenizerBase":
    if tokenizer_class is not None:
        module, _, name = tokenizer_class.partition(":")
        tokenizer_type = getattr(importlib.import_module(module), name)
    else:
        from transformers import AutoTokenizer  # NOTE: lazy: config/ and utils/ stay light

        tokenizer_type = AutoTokenizer
    tokenizer: PreTrainedTokenizerBase = tokenizer_type.from_pretrained(source)
    return tokenizer
