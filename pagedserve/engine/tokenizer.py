"""The model's tokenizer: from the folder, the --tokenizer argument, or the GGUF file's metadata."""

from typing import TYPE_CHECKING, TypeAlias, Union

from pagedserve.config import ModelConfig
from pagedserve.utils.hf_tokenizer import load_hf_tokenizer, tokenizer_source
from pagedserve.utils.light_tokenizer import LightTokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# What the frontend reads: transformers' tokenizer (the offline LLM, loaded here), or the API server's,
# which answers the same without importing transformers (utils/light_tokenizer.py).
AnyTokenizer: TypeAlias = Union["PreTrainedTokenizerBase", LightTokenizer]


def load_tokenizer(config: ModelConfig) -> "PreTrainedTokenizerBase":
    return load_hf_tokenizer(tokenizer_source(config.model, config.tokenizer, config.gguf_file))
