"""`awq`: AWQ checkpoints as AutoAWQ publishes them (GEMM version), 4-bit, repacked for the native kernels
(`int4_groups.py`).

Per linear layer with K input and N output features: `qweight` int32 [K, N / 8] and `qzeros` int32
[K / g, N / 8], eight 4-bit values packed along N in AWQ's interleaved order (the value at bits 4j belongs to
column 8c + AWQ_ORDER[j]), `scales` fp16 [K / g, N]; w = scale * (q - zero).
"""

import torch

from pagedserve.quantization.int4_groups import (
    GroupedInt4Config,
    GroupedInt4Method,
    ToOutputMajor,
    pack_pairs,
    unpack_int4,
)

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # packed position j holds column AWQ_ORDER[j] of each eight
COLUMN_POSITION = [AWQ_ORDER.index(column) for column in range(8)]  # column -> packed position


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] packed in AWQ's order -> uint8 [R, C * 8] in column order."""
    values = unpack_int4(packed).reshape(packed.shape[0], -1, 8)
    return values[:, :, COLUMN_POSITION].reshape(packed.shape[0], -1)


class AWQMethod(GroupedInt4Method):
    def staged_tensors(self) -> dict[str, tuple[torch.dtype, ToOutputMajor, torch.Tensor]]:
        return {
            "qweight": (torch.int32, lambda t: pack_pairs(unpack_awq(t).t()), self.pairs),
            "qzeros": (torch.int32, lambda t: unpack_awq(t).t(), self.zeros),
            "scales": (torch.float16, lambda t: t.t(), self.scales),
        }


class AWQConfig(GroupedInt4Config):
    """Linear layers from an AWQ checkpoint; embeddings and the LM head stay float."""

    name = "awq"
    method_class = AWQMethod
