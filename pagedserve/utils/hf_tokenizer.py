"""The model's HF tokenizer, loaded once per process and folder version.

The engine, the structured-output compiler, and the reasoning and pooling configs each need the same
tokenizer; loading one parses its tokenizer.json (megabytes for a 50k vocabulary: a quarter of a second or
more) every time, and an offline `LLM(...)` asked for it up to four times. Callers only read it."""

import functools
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


def load_hf_tokenizer(source: str) -> "PreTrainedTokenizerBase":
    """The tokenizer at `source`, of the class AutoTokenizer picks."""
    if os.path.isdir(source):
        folder = os.path.realpath(source)
        stamp = tuple(
            sorted(
                (name, os.stat(os.path.join(folder, name)).st_mtime_ns)
                for name in os.listdir(folder)
                if name.startswith(_TOKENIZER_FILES)
            )
        )
        return _load(folder, stamp)
    return _load(source, ())


@functools.lru_cache(maxsize=8)
def _load(source: str, stamp: tuple[tuple[str, int], ...]) -> "PreTrainedTokenizerBase":
    from transformers import AutoTokenizer  # NOTE: lazy: config/ and utils/ stay light

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(source)
    return tokenizer
