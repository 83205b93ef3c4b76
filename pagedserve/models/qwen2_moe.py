"""Qwen2-MoE: the Qwen2 attention (q/k/v bias); sparse layers (every `decoder_sparse_step`-th, except
`mlp_only_layers`) are a mixture of experts plus a gated shared expert, the others a dense MLP."""
from typing import Any

from torch import nn

from pagedserve.models.llama import LlamaMLP
from pagedserve.models.mixtral import MixtralForCausalLM, SparseMoeBlock


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    return (layer_idx not in (config.mlp_only_layers or []) and config.num_experts > 0
            and (layer_idx + 1) % config.decoder_sparse_step == 0)


class Qwen2MoeForCausalLM(MixtralForCausalLM):
    qkv_bias = True
    windows_by_layer_types = True
    moe_module_name = "mlp"

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        if not is_sparse_layer(config, layer_idx):
            return super(MixtralForCausalLM, self).make_mlp(config, layer_idx)
        shared = None
        if getattr(config, "shared_expert_intermediate_size", 0):
            shared = LlamaMLP(config.hidden_size, config.shared_expert_intermediate_size, config.hidden_act)
        return SparseMoeBlock(config, config.moe_intermediate_size, config.norm_topk_prob, shared)
