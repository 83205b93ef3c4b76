"""Mixtral: the Llama attention; each layer's MLP is a sparse mixture of experts (top-k of a softmax
router, renormalized), run by the fused experts layer (layers/moe.py)."""

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.layers.moe import FusedMoE, select_experts
from pagedserve.models.llama import LlamaForCausalLM, ParamShard

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# A per-expert checkpoint tensor: Mixtral's w1 (gate), w3 (up), w2 (down), or Qwen-MoE's gate/up/down_proj.
_EXPERT = re.compile(r"(.*\.experts)\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
# A quantized expert's blocks (a GGUF file kept quantized: model_loader/gguf.py splits the stacked experts).
_QUANTIZED_EXPERT = re.compile(
    r"(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(qweight|qweight_type)$"
)
# All experts' tensors in one (the layout transformers 5 uses in memory).
_FUSED_EXPERTS = re.compile(r"(.*\.experts)\.(gate_up_proj|down_proj)$")
_PARTS = {
    "w1": "gate",
    "w3": "up",
    "w2": "down",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
    "gate_up_proj": "gate_up",
}


class SparseMoeBlock(nn.Module):
    """Router (`gate`, replicated) and experts; `shared_expert` (Qwen2-MoE), when given, is added to
    every token's output, weighted by sigmoid(shared_expert_gate(x))."""

    def __init__(
        self,
        config: "PretrainedConfig",
        intermediate_size: int,
        renormalize: bool,
        shared_expert: nn.Module | None = None,
    ) -> None:
        super().__init__()
        num_experts = getattr(config, "num_local_experts", None) or config.num_experts
        self.top_k, self.renormalize = config.num_experts_per_tok, renormalize
        self.gate = nn.Linear(config.hidden_size, num_experts, bias=False).requires_grad_(False)
        self.experts = FusedMoE(num_experts, config.hidden_size, intermediate_size, config.hidden_act)
        self.shared_expert = shared_expert
        if shared_expert is not None:
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(self.gate(x), self.top_k, self.renormalize)
        out: torch.Tensor = self.experts(x, weights, ids)
        if self.shared_expert is None:
            return out
        shared: torch.Tensor = self.shared_expert(x)
        return out + torch.sigmoid(self.shared_expert_gate(x)) * shared


def expert_tensors(name: str, tensor: torch.Tensor) -> ParamShard | None:
    """A checkpoint tensor of the experts -> (w13_weight or w2_weight, tensor, (expert, part)), or for a
    quantized expert (w13.E.qweight... or w2.E.qweight..., tensor, gate/up shard 0/1 or None); None for
    any other tensor."""
    if quantized := _QUANTIZED_EXPERT.match(name):
        prefix, expert, part = quantized.group(1), quantized.group(2), _PARTS[quantized.group(3)]
        shard = None if part == "down" else ("gate", "up").index(part)
        return f"{prefix}.{'w2' if part == 'down' else 'w13'}.{expert}.{quantized.group(4)}", tensor, shard
    match = _EXPERT.match(name)
    if match:
        prefix, expert, part = match.group(1), int(match.group(2)), _PARTS[match.group(3)]
    elif match := _FUSED_EXPERTS.match(name):
        prefix, expert, part = match.group(1), None, _PARTS[match.group(2)]
    else:
        return None
    return f"{prefix}.{'w2' if part == 'down' else 'w13'}_weight", tensor, (expert, part)


class MixtralForCausalLM(LlamaForCausalLM):
    def make_mlp(self, config: "PretrainedConfig", layer_idx: int) -> nn.Module:
        return SparseMoeBlock(config, config.intermediate_size, renormalize=True)

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[ParamShard]:
        assert self.facts.moe is not None, "a mixture-of-experts family's entry has its layout"
        name = name.replace(f".{self.facts.moe.checkpoint_module}.", ".mlp.")
        expert = expert_tensors(name, tensor)
        if expert is not None:
            yield expert
        else:
            yield from super().checkpoint_tensors(name, tensor)
