"""The attention metadata of the step being computed, read by every Attention layer. Models never see
block tables: the runner sets this around the forward pass, one metadata per KV cache group (each group's
layers read their own block tables and slot mapping; one group for models without windows)."""

from types import TracebackType

from pagedserve.attention.backends.base import AttentionMetadata

_METADATA: tuple[AttentionMetadata, ...] = ()


class ForwardContext:
    """`with ForwardContext(*group_metadata):` the forward pass inside reads `group_metadata[g]` for KV
    cache group g. NOTE: a class, not a generator context manager: contextlib's machinery costs tens of
    microseconds per step beside a CPU forward (its code is cold by then)."""

    __slots__ = ("group_metadata",)

    def __init__(self, *group_metadata: AttentionMetadata) -> None:
        self.group_metadata = group_metadata

    def __enter__(self) -> None:
        global _METADATA
        _METADATA = self.group_metadata

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        global _METADATA
        _METADATA = ()


def get_attention_metadata(group: int = 0) -> AttentionMetadata:
    assert _METADATA, "attention called outside a ForwardContext"
    return _METADATA[group]
