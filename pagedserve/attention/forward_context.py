"""The attention metadata of the step being computed, read by every Attention layer. Models never see
block tables: the runner sets this around the forward pass, one metadata per KV cache group (each group's
layers read their own block tables and slot mapping; one group for models without windows)."""

from types import TracebackType

from pagedserve.attention.backends.base import AttentionMetadata

_METADATA: tuple[AttentionMetadata, ...] = ()
_FORWARD_COUNT = 0  # forward passes entered so far: what a layer's per-pass cache is keyed on


class ForwardContext:
    """`with ForwardContext(*group_metadata):` the forward pass inside reads `group_metadata[g]` for KV
    cache group g. NOTE: a class, not a generator context manager: contextlib's machinery costs tens of
    microseconds per step beside a CPU forward (its code is cold by then)."""

    __slots__ = ("group_metadata",)

    def __init__(self, *group_metadata: AttentionMetadata) -> None:
        self.group_metadata = group_metadata

    def __enter__(self) -> None:
        global _METADATA, _FORWARD_COUNT
        _METADATA = self.group_metadata
        _FORWARD_COUNT += 1

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        global _METADATA
        _METADATA = ()


def forward_count() -> int:
    """How many forward passes have begun: a layer's cache of one pass (the rotary angles of its
    positions, shared by every layer) is keyed on it. NOTE: not on the inputs' identity alone: a steady
    decode step's inputs are the same tensors every step, rewritten (worker/decode_inputs.py)."""
    return _FORWARD_COUNT


def get_attention_metadata(group: int = 0) -> AttentionMetadata:
    assert _METADATA, "attention called outside a ForwardContext"
    return _METADATA[group]
