"""llama.cpp's BERT embedding GGUFs (general.architecture "bert": bge, MiniLM, e5, ...), which transformers
cannot read: their BertConfig from the `bert.*` metadata keys, and their WordPiece tokenizer from the
vocabulary llama.cpp's converter stored in "phantom space" form (a word-initial piece as "▁piece", a
continuation "##piece" as "piece", bracketed special tokens as they are)."""

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pagedserve.utils.gguf_metadata import metadata_int

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

_PHANTOM_SPACE = "\u2581"


def bert_config(metadata: Mapping[str, object], architecture: str) -> "PretrainedConfig":
    """The BertConfig a BERT GGUF describes (GELU, as HF's BERT; token types from its metadata), for the
    model class `architecture`."""
    from transformers import BertConfig

    eps = metadata.get("bert.attention.layer_norm_epsilon")
    return BertConfig(
        vocab_size=len(_tokens(metadata)),
        hidden_size=metadata_int(metadata, "bert.embedding_length"),
        num_hidden_layers=metadata_int(metadata, "bert.block_count"),
        num_attention_heads=metadata_int(metadata, "bert.attention.head_count"),
        intermediate_size=metadata_int(metadata, "bert.feed_forward_length"),
        max_position_embeddings=metadata_int(metadata, "bert.context_length"),
        type_vocab_size=metadata_int(metadata, "tokenizer.ggml.token_type_count", 2),
        layer_norm_eps=1e-12 if eps is None else float(eps),  # type: ignore[arg-type]
        pad_token_id=metadata_int(metadata, "tokenizer.ggml.padding_token_id", 0),
        architectures=[architecture],
    )


def _tokens(metadata: Mapping[str, object]) -> list[str]:
    """The vocabulary (read with arrays: `read_gguf(path, arrays=True)`)."""
    tokens = metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list), "the metadata was read without its arrays"
    return [str(token) for token in tokens]


def wordpiece_vocabulary(tokens: list[str]) -> list[str]:
    """llama.cpp's phantom-space tokens back to the WordPiece vocabulary they came from."""
    return [
        token.removeprefix(_PHANTOM_SPACE)
        if token.startswith(_PHANTOM_SPACE)
        else token
        if token.startswith("[") and token.endswith("]")
        else f"##{token}"
        for token in tokens
    ]


def bert_tokenizer(metadata: Mapping[str, object], folder: str) -> "PreTrainedTokenizerBase":
    """The GGUF's WordPiece tokenizer, its vocab.txt written into `folder`: [CLS] (llama.cpp's BOS) and
    [SEP] ids from the metadata, lower-casing as llama.cpp's WPM tokenizer does."""
    from transformers import BertTokenizer

    vocab = wordpiece_vocabulary(_tokens(metadata))
    os.makedirs(folder, exist_ok=True)
    vocab_file = os.path.join(folder, "vocab.txt")
    with open(vocab_file, "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    tokenizer: PreTrainedTokenizerBase = BertTokenizer(
        vocab_file,
        do_lower_case=True,
        model_max_length=metadata_int(metadata, "bert.context_length"),
        cls_token=_special(metadata, vocab, ("bos_token_id", "cls_token_id"), "[CLS]"),
        sep_token=_special(metadata, vocab, ("seperator_token_id", "eos_token_id"), "[SEP]"),
        unk_token=_special(metadata, vocab, ("unknown_token_id",), "[UNK]"),
        pad_token=_special(metadata, vocab, ("padding_token_id",), "[PAD]"),
        mask_token=_special(metadata, vocab, ("mask_token_id",), "[MASK]"),
    )
    return tokenizer


def _special(metadata: Mapping[str, object], vocab: list[str], keys: tuple[str, ...], default: str) -> str:
    """The first of the metadata keys `tokenizer.ggml.<key>` present names the token; else `default`."""
    for key in keys:
        index = metadata_int(metadata, f"tokenizer.ggml.{key}", -1)
        if 0 <= index < len(vocab):
            return vocab[index]
    return default
