"""The adapters' slots beside one linear layer, and the step's token -> slot map they all read."""

from dataclasses import dataclass

import torch

from pagedserve.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagedserve.lora.ops import add_lora
from pagedserve.lora.peft import LoRAWeights


@dataclass
class LoRABatch:
    """The step's slot of each token ([T]; -1: the base model), or None when no token has an adapter."""

    token_slots: torch.Tensor | None = None


class LinearLoRA:
    """`max_loras` adapters' A and B of one (possibly fused, possibly sharded) linear layer. Each fused
    projection (q, k, v; gate, up) has its own `max_rank` rows of A and columns of B: A [slots, n * rank,
    in], B stored transposed [slots, n * rank, out] (add_lora's layout: a row of outputs per rank),
    block-diagonal in B, so one shrink and one expand serve them all."""

    def __init__(
        self,
        layer: ColumnParallelLinear | RowParallelLinear,
        max_loras: int,
        max_rank: int,
        batch: LoRABatch,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.layer = layer
        self.max_rank = max_rank
        self.batch = batch
        width = len(layer.shard_ids) * max_rank
        # This rank's sizes: a row-parallel layer splits its input, a column-parallel one its output.
        if isinstance(layer, RowParallelLinear):
            size_in, size_out = layer.input_size_per_partition, layer.output_size
        else:
            size_in, size_out = layer.input_size, layer.output_size_per_partition
        self.a = torch.zeros(max_loras, width, size_in, device=device, dtype=dtype)
        self.b = torch.zeros(max_loras, width, size_out, device=device, dtype=dtype)

    @property
    def num_bytes(self) -> int:
        return self.a.nbytes + self.b.nbytes

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()

    def write(self, slot: int, shard_id: object, weights: LoRAWeights) -> None:
        """Put one projection's delta (full, unsharded a and b) in `slot`: this rank's shard of it, as the
        layer's weight_loader cuts its weight (columns of a row-parallel layer's a, rows of b otherwise)."""
        start = self.layer.shard_ids.index(shard_id) * self.max_rank
        cols = slice(start, start + weights.a.shape[0])
        a, b = self.a[slot, cols], self.b[slot, cols].T  # b: [out, rank], as the weight and weights.b
        if isinstance(self.layer, RowParallelLinear):
            self.layer.weight_loader(a, weights.a)  # type: ignore[arg-type]  # a plain tensor serves
            b.copy_(weights.b)
        else:
            a.copy_(weights.a)
            self.layer.weight_loader(b, weights.b, shard_id)  # type: ignore[arg-type]

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        slots = self.batch.token_slots
        if slots is not None:
            add_lora(y, x, self.a, self.b, slots)
