"""llama.cpp's BERT embedding GGUFs (general.architecture "bert": bge, MiniLM, e5, ...), which transformers
cannot read: their BertConfig from the `bert.*` metadata keys, and their WordPiece tokenizer from the
vocabulary llama.cpp's converter stored in "phantom space" form (a word-initial piece as "▁piece", a
continuation "##piece" as "piece", bracketed special tokens as they are)."""

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pagedserve.utils.gguf_metadata import metadata_int

if TYPE_CHECKING:
    from gguf import ReaderField
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

_PHANTOM_SPACE = "\u2581"


def bert_config(fields: Mapping[str, "ReaderField"]) -> "PretrainedConfig":
    """The BertConfig a "bert" GGUF describes (GELU, as HF's BERT; token types from its metadata)."""
    from transformers import BertConfig

    eps = fields.get("bert.attention.layer_norm_epsilon")
    return BertConfig(
        vocab_size=len(fields["tokenizer.ggml.tokens"].contents()),
        hidden_size=metadata_int(fields, "bert.embedding_length"),
        num_hidden_layers=metadata_int(fields, "bert.block_count"),
        num_attention_heads=metadata_int(fields, "bert.attention.head_count"),
        intermediate_size=metadata_int(fields, "bert.feed_forward_length"),
        max_position_embeddings=metadata_int(fields, "bert.context_length"),
        type_vocab_size=metadata_int(fields, "tokenizer.ggml.token_type_count", 2),
        layer_norm_eps=1e-12 if eps is None else float(eps.contents()),
        pad_token_id=metadata_int(fields, "tokenizer.ggml.padding_token_id", 0),
        architectures=["BertModel"],
    )


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


def bert_tokenizer(fields: Mapping[str, "ReaderField"], folder: str) -> "PreTrainedTokenizerBase":
    """The GGUF's WordPiece tokenizer, its vocab.txt written into `folder`: [CLS] (llama.cpp's BOS) and
    [SEP] ids from the metadata, lower-casing as llama.cpp's WPM tokenizer does."""
    from transformers import BertTokenizer

    vocab = wordpiece_vocabulary([str(t) for t in fields["tokenizer.ggml.tokens"].contents()])
    os.makedirs(folder, exist_ok=True)
    vocab_file = os.path.join(folder, "vocab.txt")
    with open(vocab_file, "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    tokenizer: PreTrainedTokenizerBase = BertTokenizer(
        vocab_file,
        do_lower_case=True,
        model_max_length=metadata_int(fields, "bert.context_length"),
        cls_token=_special(fields, vocab, ("bos_token_id", "cls_token_id"), "[CLS]"),
        sep_token=_special(fields, vocab, ("seperator_token_id", "eos_token_id"), "[SEP]"),
        unk_token=_special(fields, vocab, ("unknown_token_id",), "[UNK]"),
        pad_token=_special(fields, vocab, ("padding_token_id",), "[PAD]"),
        mask_token=_special(fields, vocab, ("mask_token_id",), "[MASK]"),
    )
    return tokenizer


def _special(
    fields: Mapping[str, "ReaderField"], vocab: list[str], keys: tuple[str, ...], default: str
) -> str:
    """The first of the metadata keys `tokenizer.ggml.<key>` present names the token; else `default`."""
    for key in keys:
        field = fields.get(f"tokenizer.ggml.{key}")
        if field is not None and 0 <= int(field.contents()) < len(vocab):
            return vocab[int(field.contents())]
    return default
