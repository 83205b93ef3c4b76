"""Apply a step's grammar bitmask (structured outputs) to the logits: disallowed tokens get -inf."""

import sys

import numpy as np
import torch

# NOTE: unpacking the int32 words byte by byte, low bit first, gives token order only on little-endian.
assert sys.byteorder == "little", "the grammar bitmask is unpacked as little-endian int32 words"


def apply_grammar_bitmask(
    logits: torch.Tensor, row_request_ids: list[str], request_ids: list[str], bitmask: np.ndarray
) -> None:
    """`logits` [R, V] (row i: `row_request_ids[i]`; a request with drafts has one row per verified
    position, in order), in place. `bitmask` row j is `request_ids[j]`'s (its k-th occurrence: that
    request's k-th position; llguidance's layout: token t is bit t % 32 of int32 word t // 32); rows of
    other requests are left alone. The bits are unpacked in numpy (one C pass), then one masked_fill."""
    rows_of: dict[str, list[int]] = {}
    for row, request_id in enumerate(row_request_ids):
        rows_of.setdefault(request_id, []).append(row)
    sources_of: dict[str, list[int]] = {}
    for source, request_id in enumerate(request_ids):
        sources_of.setdefault(request_id, []).append(source)
    vocab = logits.shape[1]
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
    assert allowed.shape[1] >= vocab, "the matchers' tokenizer is built with the model's vocab size"
    disallowed = np.zeros(logits.shape, dtype=bool)
    for request_id, sources in sources_of.items():
        rows = rows_of.get(request_id, [])
        assert len(rows) in (0, len(sources)), "one mask row per sampled position"
        for row, source in zip(rows, sources):
            disallowed[row] = allowed[source, :vocab] == 0
    logits.masked_fill_(torch.from_numpy(disallowed).to(logits.device), float("-inf"))
