"""The model's tokenizer: from the folder, the --tokenizer argument, or the GGUF file's metadata."""

from typing import TYPE_CHECKING

from pagedserve.config import ModelConfig
from pagedserve.utils.gguf_cache import gguf_hf_folder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(config: ModelConfig) -> "PreTrainedTokenizerBase":
    from transformers import AutoTokenizer

    if config.tokenizer:
        return AutoTokenizer.from_pretrained(config.tokenizer)
    if config.gguf_file:
        return AutoTokenizer.from_pretrained(gguf_hf_folder(config.gguf_file))
    return AutoTokenizer.from_pretrained(config.model)
