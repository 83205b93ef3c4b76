"""The model's HF tokenizer, loaded once per process and folder version.

The engine, the structured-output compiler, and the reasoning and pooling configs each need the same
tokenizer; loading one parses its tokenizer.json (megabytes for a 50k vocabulary: a quarter of a second or
more) every time, and an offline `LLM(...)` asked for it up to four times. Callers only read it. Its
snapshot (utils/light_tokenizer.py) is what the API server reads instead."""

import functools
import os
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from pagedserve.utils.gguf_cache import gguf_hf_folder
from pagedserve.utils.light_tokenizer import TokenizerSnapshot, backend_json

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


def snapshot_tokenizer(hf_tokenizer: "PreTrainedTokenizerBase") -> TokenizerSnapshot:
    """The snapshot of a transformers fast tokenizer. Raises ValueError for a slow one (no Rust backend)."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise ValueError(
            f"The tokenizer {type(hf_tokenizer).__name__} has no fast (tokenizers) backend; the API server "
            "reads only fast tokenizers: pass one with --tokenizer."
        )
    clean_up = bool(hf_tokenizer.clean_up_tokenization_spaces) and (
        type(backend.model).__name__ != "BPE"
        or bool(
            getattr(
                hf_tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False
            )
        )
    )
    return TokenizerSnapshot(
        backend_json=backend_json(backend),
        special_tokens=dict(hf_tokenizer.special_tokens_map),
        bos_token_id=hf_tokenizer.bos_token_id,
        eos_token_id=hf_tokenizer.eos_token_id,
        all_special_ids=tuple(hf_tokenizer.all_special_ids),
        chat_template=hf_tokenizer.chat_template,
        clean_up_spaces=clean_up,
        token_types="token_type_ids" in hf_tokenizer.model_input_names,
    )
