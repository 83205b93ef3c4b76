"""Qwen2-MoE: the Qwen2 attention (q/k/v bias); sparse layers (every `decoder_sparse_step`-th, except
`mlp_only_layers`) are a mixture of experts plus a gated shared expert, the others a dense MLP."""

from typing import TYPE_CHECKING

from torch import nn

from pagedserve.models.llama import LlamaMLP
from pagedserve.models.mixtral import MixtralForCausalLM, SparseMoeBlock
from pagedserve.utils.hf_config import is_sparse_layer

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class Qwen2MoeForCausalLM(MixtralForCausalLM):
    def make_mlp(self, config: "PretrainedConfig", layer_idx: int) -> nn.Module:
        if not is_sparse_layer(config, layer_idx):
            return super(MixtralForCausalLM, self).make_mlp(config, layer_idx)
        shared = None
        if getattr(config, "shared_expert_intermediate_size", 0):
            shared = LlamaMLP(config.hidden_size, config.shared_expert_intermediate_size, config.hidden_act)
        return SparseMoeBlock(config, config.moe_intermediate_size, config.norm_topk_prob, shared)
