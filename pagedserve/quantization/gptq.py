"""`gptq`: GPTQ checkpoints as AutoGPTQ and GPTQModel publish them, 4-bit, repacked for the native kernels
(`int4_groups.py`).

Per linear layer with K input and N output features: `qweight` int32 [K / 8, N] (eight 4-bit values packed
along K, row 8i + j at bits 4j), `qzeros` int32 [K / g, N / 8] (packed along N the same way; v1 checkpoints,
checkpoint_format "gptq", store each zero point minus one, "gptq_v2" stores it as is), `scales` fp16
[K / g, N], `g_idx` int32 [K] (the group of each input column: column // g, or out of order with act-order).
"""

import torch
from torch import nn

from pagedserve.errors import ConfigError
from pagedserve.quantization.int4_groups import (
    GroupedInt4Config,
    GroupedInt4Method,
    ToOutputMajor,
    pack_pairs,
    read_whole,
    unpack_int4,
)


class GPTQMethod(GroupedInt4Method):
    def staged_tensors(self) -> dict[str, tuple[torch.dtype, ToOutputMajor, torch.Tensor]]:
        zero_offset = 1 if self.format.zeros_minus_one else 0
        return {
            "qweight": (torch.int32, lambda t: pack_pairs(unpack_int4(t.t())), self.pairs),
            "qzeros": (torch.int32, lambda t: (unpack_int4(t) + zero_offset).t(), self.zeros),
            "scales": (torch.float16, lambda t: t.t(), self.scales),
        }

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        super().create_weights(layer, input_size, output_size)
        g_idx = nn.Parameter(torch.empty(0, dtype=torch.int32), requires_grad=False)
        g_idx.weight_loader = lambda _, loaded, shard_id=None: self._load_group_index(read_whole(loaded))  # type: ignore[attr-defined]
        layer.g_idx = g_idx

    def _load_group_index(self, g_idx: torch.Tensor) -> None:
        """g_idx always holds the whole input dimension. Without act-order it must be column // g (and is
        then not needed); with it, the projections fused into one layer (q/k/v, gate/up: quantized on the
        same inputs) must share it, since one permutation of the activations serves the whole layer."""
        g_idx = g_idx.to(torch.int64)
        group_size = self.format.group_size
        if not self.format.desc_act:
            expected = (
                torch.arange(g_idx.numel()) // group_size if group_size > 0 else torch.zeros_like(g_idx)
            )
            if not torch.equal(g_idx, expected):
                raise ConfigError(
                    "The gptq checkpoint's g_idx puts columns out of order but its quantization_config "
                    "says desc_act false; set desc_act true in config.json."
                )
            return
        if g_idx.numel() != self.cols or bool((g_idx < 0).any() or (g_idx >= self.zeros.shape[1]).any()):
            raise ConfigError(
                f"The gptq checkpoint's g_idx has {g_idx.numel()} entries or groups outside "
                f"0..{self.zeros.shape[1] - 1}; a layer with {self.cols} input columns needs one group "
                "per column."
            )
        if self.group_index is not None and not torch.equal(self.group_index, g_idx):
            raise ConfigError(
                "The gptq checkpoint gives projections fused into one layer (q/k/v or gate/up) different "
                "act-order g_idx; pagedserve needs them equal (GPTQ's act-order on a shared input)."
            )
        self.group_index = g_idx

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        del layer.g_idx
        super().process_weights_after_loading(layer)


class GPTQConfig(GroupedInt4Config):
    """Linear layers from a GPTQ checkpoint; embeddings and the LM head stay float."""

    name = "gptq"
    method_class = GPTQMethod
