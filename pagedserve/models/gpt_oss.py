"""gpt-oss: the Llama attention with q/k/v/o biases and a learned sink logit per head (attention sinks),
sliding-window (`layer_types`) and full layers alternating, YaRN rope, and a mixture of experts in every
layer: a router with a bias whose top-k logits are softmaxed, experts with biases and a clamped SwiGLU."""

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.layers.activation import ClampedSwigluAndMul
from pagedserve.layers.moe import FusedMoE, select_top_logits
from pagedserve.models.llama import AttentionOptions, LlamaForCausalLM, ParamShard
from pagedserve.quantization.base import linear
from pagedserve.utils.hf_config import layer_sliding_window

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class GptOssMoE(nn.Module):
    """`router` (replicated, with a bias) and `experts`, HF's names."""

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.router = nn.Linear(config.hidden_size, config.num_local_experts, bias=True).requires_grad_(False)
        self.experts = FusedMoE(
            config.num_local_experts,
            config.hidden_size,
            config.intermediate_size,
            activation=ClampedSwigluAndMul(config.swiglu_alpha, config.swiglu_limit),
            bias=True,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: `linear`, not the router's own forward: on CPU its sums do not depend on the step's other
        # rows, so neither does which experts a token picks (batch invariance).
        logits = linear(x, self.router.weight) + self.router.bias
        weights, ids = select_top_logits(logits, self.top_k)
        out: torch.Tensor = self.experts(x, weights, ids)
        return out


def _deinterleave(gate_up: torch.Tensor, dim: int) -> torch.Tensor:
    """HF keeps gate and up interleaved (gate at even, up at odd indices of `dim`): the gate half first,
    then the up half, as the fused experts layer stores them."""
    # NOTE: a torch function first: a checkpoint tensor is read from the file by one (not by indexing).
    pairs = torch.unflatten(gate_up, dim, (-1, 2))
    return torch.cat([pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)], dim=dim)


# An MXFP4 checkpoint's experts (quantization/mxfp4.py): HF's tensor -> (ours, shard part).
_MXFP4_PARTS = {
    "gate_up_proj_blocks": ("w13_blocks", "gate_up"),
    "gate_up_proj_scales": ("w13_scales", "gate_up"),
    "down_proj_blocks": ("w2_blocks", "down"),
    "down_proj_scales": ("w2_scales", "down"),
}


class GptOssForCausalLM(LlamaForCausalLM):
    def attention_options(self, config: "PretrainedConfig", layer_idx: int) -> AttentionOptions:
        return AttentionOptions(
            qkv_bias=config.attention_bias,
            o_bias=config.attention_bias,
            sliding_window=layer_sliding_window(config, layer_idx, type(self).__name__),
            sinks=True,
        )

    def make_mlp(self, config: "PretrainedConfig", layer_idx: int) -> nn.Module:
        return GptOssMoE(config)

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[ParamShard]:
        """HF's experts: gate_up_proj [E, hidden, 2 * intermediate] (interleaved) and down_proj
        [E, intermediate, hidden], transposed to the fused layer's [E, out, in], and their biases."""
        prefix, _, part = name.rpartition(".experts.")
        if part in _MXFP4_PARTS:  # [E, rows, blocks(, 16)]: gate/up interleaved by rows, as the weight
            ours, shard = _MXFP4_PARTS[part]
            packed = _deinterleave(tensor, 1) if ours.startswith("w13") else tensor
            yield f"{prefix}.experts.{ours}", packed, (None, shard)
        elif part == "gate_up_proj":
            weight = _deinterleave(torch.transpose(tensor, 1, 2), 1)
            yield f"{prefix}.experts.w13_weight", weight, (None, "gate_up")
        elif part == "gate_up_proj_bias":
            yield f"{prefix}.experts.w13_bias", _deinterleave(tensor, 1), (None, "gate_up")
        elif part == "down_proj":
            yield f"{prefix}.experts.w2_weight", torch.transpose(tensor, 1, 2), (None, "down")
        elif part == "down_proj_bias":
            yield f"{prefix}.experts.w2_bias", tensor, (None, "down")
        else:
            yield from super().checkpoint_tensors(name, tensor)
