"""The model's tokenizer: from the folder, the --tokenizer argument, or the GGUF file's metadata."""

from typing import TYPE_CHECKING

from pagedserve.config import ModelConfig
from pagedserve.utils.hf_tokenizer import load_hf_tokenizer, tokenizer_source

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(config: ModelConfig) -> "PreTrainedTokenizerBase":
    return load_hf_tokenizer(tokenizer_source(config.model, config.tokenizer, config.gguf_file))
