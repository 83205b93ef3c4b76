"""Which leading blocks of a request its attention never reads again, per layer group (vLLM v1's
sliding-window manager, for a block table that every layer shares).

Layers are grouped by their window (None: full attention). The query at position p of a layer with window
W reads positions (p - W, p]; a request whose next query is at `num_computed_tokens` therefore never reads
a token before num_computed_tokens - W + 1 again in that group. A block is unreachable when it lies wholly
before that point in every group: with one table shared by all layers, a single full-attention group keeps
every block (Gemma 2/3's global layers), while models whose layers all have a window (Mistral v0.1,
Qwen2 with every layer windowed) free all but the last ceil(W / block_size) + 1 blocks as they decode."""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SlidingWindowPolicy:
    """`group_windows`: the window of each layer group (None: full attention)."""

    group_windows: tuple[int | None, ...]
    block_size: int

    @classmethod
    def from_layer_windows(
        cls, layer_windows: Sequence[int | None], block_size: int
    ) -> "SlidingWindowPolicy":
        return cls(tuple(sorted(set(layer_windows), key=lambda w: (w is None, w or 0))), block_size)

    @property
    def reach(self) -> int | None:
        """How far back the widest group reads; None when some group reads everything."""
        if not self.group_windows or None in self.group_windows:
            return None
        return max(w for w in self.group_windows if w is not None)

    def num_unreachable_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks that no group reads again once `num_computed_tokens` tokens are computed."""
        reach = self.reach
        if reach is None:
            return 0
        return max(0, num_computed_tokens - reach + 1) // self.block_size
