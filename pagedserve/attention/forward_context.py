"""The attention metadata of the step being computed, read by every Attention layer. Models never see
block tables: the runner sets this around the forward pass."""

from collections.abc import Iterator
from contextlib import contextmanager

from pagedserve.attention.backends.base import AttentionMetadata

_METADATA: AttentionMetadata | None = None


@contextmanager
def set_forward_context(metadata: AttentionMetadata) -> Iterator[None]:
    global _METADATA
    _METADATA = metadata
    try:
        yield
    finally:
        _METADATA = None


def get_attention_metadata() -> AttentionMetadata:
    assert _METADATA is not None, "attention called outside set_forward_context"
    return _METADATA
