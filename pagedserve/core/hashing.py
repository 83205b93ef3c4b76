"""Content hashes of full KV blocks, chained so that a block's hash names its whole prefix.

hash(block i) = sha256(hash(block i - 1) + token ids of block i); the first block mixes in the
request's `cache_salt` and LoRA adapter identity (id and files' digest) instead of a parent. Equal hashes
therefore mean equal token prefixes (and salts, and adapters: an adapter's K/V differ from the base
model's), up to sha256 collisions; a hit is still verified against the block's token ids. A block
holding an image's placeholder tokens also mixes in that image's content hash: the same text with another
image is another prefix.
"""

import hashlib
from array import array
from collections.abc import Sequence

from pagedserve.protocol import ImageInput

BlockHash = bytes  # 32 bytes

# NOTE: distinct leading bytes keep a first block (salt + tokens) and a later block (parent + tokens)
# from ever producing the same byte string.
_FIRST, _CHAINED = b"\x00", b"\x01"


def hash_block_tokens(
    parent: BlockHash | None,
    token_ids: Sequence[int],
    cache_salt: str | None = None,
    lora_key: bytes = b"",
    image_key: bytes = b"",
) -> BlockHash:
    """The hash of one full block: `parent` is the previous block's hash (None for the first block,
    which takes `cache_salt` and `lora_key` instead; they then reach every later block through the chain).
    `image_key`: the content hashes of the images whose tokens the block holds (after the tokens, whose
    length is fixed: no image key can spell other tokens)."""
    tokens = array("q", token_ids).tobytes() + image_key
    if parent is None:
        salt = (cache_salt or "").encode()
        # NOTE: each field after its length: no salt can spell another adapter's key.
        key = len(lora_key).to_bytes(4, "little") + lora_key + len(salt).to_bytes(4, "little") + salt
        return hashlib.sha256(_FIRST + key + tokens).digest()
    return hashlib.sha256(_CHAINED + parent + tokens).digest()


def extend_block_hashes(
    hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    num_blocks: int,
    cache_salt: str | None,
    lora_key: bytes = b"",
    images: Sequence[ImageInput] = (),
) -> None:
    """Append to `hashes` (the chain of a request's first full blocks) until it covers `num_blocks`
    full blocks of `token_ids`. The caller guarantees `num_blocks * block_size <= len(token_ids)`."""
    for index in range(len(hashes), num_blocks):
        parent = hashes[-1] if hashes else None
        start, end = index * block_size, (index + 1) * block_size
        image_key = b"".join(
            bytes.fromhex(image.content_hash)
            for image in images
            if image.offset < end and start < image.offset + image.length
        )
        hashes.append(hash_block_tokens(parent, token_ids[start:end], cache_salt, lora_key, image_key))
