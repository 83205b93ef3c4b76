"""Layers split into KV cache groups (vLLM v1's hybrid KV-cache manager), so that models mixing windowed
and full-attention layers free their windowed layers' old blocks too.

Layers are sorted by attention type (their sliding window; None: full attention) and each type is cut
into groups of `group_size` layers (vLLM's `_get_kv_cache_config_uniform_page_size`): the smallest type's
layer count, or the largest one's when all counts are within 25% of each other (then no type is cut). A
request has one block table per group, all drawn from one pool, and a block id is memory for
`group_size` layers: the workers allocate `group_size` K/V tensors, and the i-th layer of every group
reads and writes tensor i. A block a window group no longer reads therefore returns the memory of that
group's layers. Group 0 is a full-attention group when the model has one (the draft model of speculative
decoding reads its tables).

One group (every layer of the same type: Llama, Mistral, ...) is the layout of a model without groups."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.utils import cdiv
from pagedserve.utils.hf_config import layer_windows

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class KVCacheGroups:
    """`layers[g]`: the layer indices of group g (in model order); `windows[g]`: their window."""

    layers: tuple[tuple[int, ...], ...]
    windows: tuple[int | None, ...]
    block_size: int

    @classmethod
    def from_layer_windows(cls, layer_windows: Sequence[int | None], block_size: int) -> "KVCacheGroups":
        by_type: dict[int | None, list[int]] = {}
        for layer, window in enumerate(layer_windows):
            by_type.setdefault(window, []).append(layer)
        # Full attention first, then windows from the narrowest.
        types = sorted(by_type, key=lambda w: (w is not None, w or 0))
        counts = [len(by_type[w]) for w in types]
        size = max(counts) if max(counts) < 1.25 * min(counts) else min(counts)
        layers: list[tuple[int, ...]] = []
        windows: list[int | None] = []
        for window in types:
            members = by_type[window]
            for start in range(0, len(members), size):
                layers.append(tuple(members[start : start + size]))
                windows.append(window)
        return cls(tuple(layers), tuple(windows), block_size)

    @classmethod
    def for_model(cls, hf_config: "PretrainedConfig", architecture: str, block_size: int) -> "KVCacheGroups":
        """The groups of a model's layers, read from its HF config (the engine and the workers agree)."""
        return cls.from_layer_windows(layer_windows(hf_config, architecture), block_size)

    @property
    def num_groups(self) -> int:
        return len(self.layers)

    @property
    def group_size(self) -> int:
        """Layers per group (the last group of a type may have fewer): the K/V tensors a block id spans."""
        return max(len(members) for members in self.layers)

    def tensor_of_layer(self) -> dict[int, tuple[int, int]]:
        """Layer index -> (its group, the K/V tensor it uses: its place in the group)."""
        return {
            layer: (group, slot)
            for group, members in enumerate(self.layers)
            for slot, layer in enumerate(members)
        }

    def num_unreachable_blocks(self, group: int, num_computed_tokens: int) -> int:
        """Leading blocks of `group`'s table that it never reads again once `num_computed_tokens` tokens
        are computed: the query at position p of a layer with window W reads positions (p - W, p]."""
        window = self.windows[group]
        if window is None:
            return 0
        return max(0, num_computed_tokens - window + 1) // self.block_size

    def max_blocks(self, num_tokens: int, chunk: int) -> int:
        """Blocks (all groups) a request of `num_tokens` tokens holds at most, growing by prefill chunks of
        up to `chunk` tokens: every block in a full-attention group; in a window group of W at most
        ceil((W - 1 + chunk) / block_size) + 1 (one decode step: ceil(W / block_size) + 1)."""
        entries = cdiv(num_tokens, self.block_size)
        return sum(
            entries if window is None else min(entries, cdiv(window - 1 + chunk, self.block_size) + 1)
            for window in self.windows
        )
