"""gpt-oss's harmony encoding (the `openai-harmony` package), loaded offline.

openai-harmony reads the o200k vocabulary from `$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken` (else it
downloads it). Unless that variable is set, the file is written once into the cache folder
(`$PAGEDSERVE_CACHE_DIR/harmony`, default `~/.cache/pagedserve/harmony`) from the vocabulary the
`quicktok-v1` package ships, and checked against the published file's SHA-256: a server needs no
network to serve gpt-oss."""

import base64
import functools
import hashlib
import importlib.util
import os
import struct
from typing import TYPE_CHECKING

from pagedserve.errors import ConfigError

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding

VOCAB_FILE = "o200k_base.tiktoken"
# The SHA-256 of OpenAI's published o200k_base.tiktoken: a rebuilt file must be byte for byte that one.
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
_FIX = (
    "install the package (pip install quicktok-v1), or set TIKTOKEN_ENCODINGS_BASE to a folder holding "
    f"{VOCAB_FILE}"
)


def vocab_folder() -> str:
    """The folder openai-harmony reads the vocabulary from: $TIKTOKEN_ENCODINGS_BASE as set, else the
    cache folder, where the file is written on first use. Raises ConfigError naming what to do."""
    given = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if given:
        return given
    root = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pagedserve")
    folder = os.path.join(os.environ.get("PAGEDSERVE_CACHE_DIR", root), "harmony")
    path = os.path.join(folder, VOCAB_FILE)
    if not os.path.isfile(path):
        _write_vocab(path)
    return folder


def _write_vocab(path: str) -> None:
    """o200k_base.tiktoken (base64 of each token's bytes, its rank) rebuilt from quicktok-v1's
    o200k.vocab (a count, then per token: u16 length, the bytes, u32 rank; little-endian)."""
    spec = importlib.util.find_spec("quicktok")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"gpt-oss's harmony format needs the o200k vocabulary: {_FIX}.")
    source = os.path.join(spec.submodule_search_locations[0], "data", "o200k.vocab")
    with open(source, "rb") as f:
        data = f.read()
    (count,), offset = struct.unpack_from("<I", data), 4
    tokens: list[tuple[int, bytes]] = []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        raw = data[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        tokens.append((rank, raw))
        offset += 6 + length
    text = "".join(f"{base64.b64encode(raw).decode()} {rank}\n" for rank, raw in sorted(tokens)).encode()
    if hashlib.sha256(text).hexdigest() != VOCAB_SHA256:
        raise ConfigError(f"{source} does not rebuild OpenAI's {VOCAB_FILE} (its SHA-256 differs): {_FIX}.")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(text)
        os.replace(tmp, path)  # NOTE: atomic: a concurrent reader sees no file or the whole one
    except OSError as error:
        raise ConfigError(
            f"cannot write {path} ({error}): set PAGEDSERVE_CACHE_DIR to a writable folder, or "
            f"TIKTOKEN_ENCODINGS_BASE to one holding {VOCAB_FILE}."
        ) from error


@functools.cache
def harmony_encoding() -> "HarmonyEncoding":
    """HARMONY_GPT_OSS, loaded once per process. Raises ConfigError when its vocabulary is missing."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    # NOTE: openai-harmony reads the folder from the environment only.
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = vocab_folder()
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
