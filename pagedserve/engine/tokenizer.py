"""The model's tokenizer: from the folder, the --tokenizer argument, or the GGUF file's metadata."""

from typing import TYPE_CHECKING

from pagedserve.config import ModelConfig
from pagedserve.utils.hf_tokenizer import load_hf_tokenizer, tokenizer_source

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(config: ModelConfig, tokenizer_class: str | None = None) -> "PreTrainedTokenizerBase":
    """`tokenizer_class`: the class to load it as ("module:qualname"), else AutoTokenizer's pick."""
    source = tokenizer_source(config.model, config.tokenizer, config.gguf_file)
    return load_hf_tokenizer(source, tokenizer_class)
