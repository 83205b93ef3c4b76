"""The attention metadata of the step being computed, read by every Attention layer. Models never see
block tables: the runner sets this around the forward pass, one metadata per KV cache group (each group's
layers read their own block tables and slot mapping; one group for models without windows)."""

from collections.abc import Iterator
from contextlib import contextmanager

from pagedserve.attention.backends.base import AttentionMetadata

_METADATA: tuple[AttentionMetadata, ...] = ()


@contextmanager
def set_forward_context(*group_metadata: AttentionMetadata) -> Iterator[None]:
    """`group_metadata[g]`: the metadata of KV cache group g."""
    global _METADATA
    _METADATA = group_metadata
    try:
        yield
    finally:
        _METADATA = ()


def get_attention_metadata(group: int = 0) -> AttentionMetadata:
    assert _METADATA, "attention called outside set_forward_context"
    return _METADATA[group]
