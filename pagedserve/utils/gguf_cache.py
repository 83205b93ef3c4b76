"""A GGUF file's config and tokenizer, converted by transformers once and kept as a HF folder.

NOTE: transformers re-parses the whole GGUF (tens of thousands of vocabulary strings) for the config
and again for the tokenizer, several seconds each; the converted folder loads in milliseconds. It reads
only the header (metadata and tensor infos), so a conversion is keyed on the header's digest: a copy, a
re-download, or another file of the same header (the same model's shapes and metadata) share one.
"""

import functools
import hashlib
import os

from pagedserve.families import ENCODERS, gguf_family
from pagedserve.utils.gguf_bert import bert_tokenizer
from pagedserve.utils.gguf_config import gguf_hf_config
from pagedserve.utils.gguf_metadata_config import bpe_tokenizer
from pagedserve.utils.gguf_tensors import read_gguf

# Bumped when the conversion changes, so folders converted by an older version are not reused.
_CONVERSION_VERSION = 8

_CACHE_ROOT = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pagedserve", "gguf"
)


@functools.lru_cache(maxsize=64)
def _header_digest(path: str, size: int, mtime_ns: int) -> str:
    """Read once per file version and process: a load asks for the folder several times (config,
    tokenizer, plan), and the header walk takes tens of milliseconds for a large vocabulary."""
    return read_gguf(path).header_digest


def gguf_cache_folder(name: str) -> str:
    """Where the conversion called `name` is kept (PAGEDSERVE_CACHE_DIR, default ~/.cache/pagedserve/gguf)."""
    return os.path.join(os.environ.get("PAGEDSERVE_CACHE_DIR", _CACHE_ROOT), name)


def gguf_hf_folder(gguf_file: str) -> str:
    """A folder with config.json and tokenizer files for `gguf_file`, created on first use."""
    stat = os.stat(gguf_file)
    digest = _header_digest(os.path.realpath(gguf_file), stat.st_size, stat.st_mtime_ns)
    key = hashlib.sha256(f"{digest}:{_CONVERSION_VERSION}".encode())
    folder = gguf_cache_folder(key.hexdigest()[:16])
    if os.path.isfile(os.path.join(folder, "done")):
        return folder
    from transformers import AutoTokenizer

    directory, name = os.path.split(gguf_file)
    tmp = f"{folder}.tmp{os.getpid()}"
    config = gguf_hf_config(directory or ".", name)
    config.save_pretrained(tmp)
    # NOTE: transformers reads no WordPiece vocabulary from a GGUF
    if config.model_type in {family.model_type for family in ENCODERS}:
        tokenizer = bert_tokenizer(read_gguf(gguf_file, arrays=True).metadata, tmp)
    elif _bpe_read_here(gguf_file):
        tokenizer = bpe_tokenizer(read_gguf(gguf_file, arrays=True).metadata)
    else:
        tokenizer = AutoTokenizer.from_pretrained(directory or ".", gguf_file=name)
    tokenizer.save_pretrained(tmp)
    open(os.path.join(tmp, "done"), "w").close()
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process finished first
        pass
    return folder


def _bpe_read_here(gguf_file: str) -> bool:
    """Whether the file's vocabulary is one transformers cannot read (families.GGUFFacts): any of an
    architecture whose config it cannot read, a byte-level BPE one of a SentencePiece-only architecture."""
    metadata = read_gguf(gguf_file).metadata
    facts = gguf_family(str(metadata["general.architecture"]))
    if facts is None or facts.gguf is None:
        return False
    bpe = metadata.get("tokenizer.ggml.model") == "gpt2"
    return facts.gguf.config_from_metadata or (facts.gguf.sentencepiece_only and bpe)
