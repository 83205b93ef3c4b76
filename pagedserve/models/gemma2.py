"""Gemma 2: the Llama attention and gated MLP (GeGLU) in a layer with four (1 + w) RMSNorms (before and
after attention, before and after the MLP), the embedding scaled by sqrt(hidden_size), queries scaled by
query_pre_attn_scalar ** -0.5, soft-capped attention and final logits, and alternating local (sliding
window) and global layers."""

from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.layers.layernorm import GemmaRMSNorm
from pagedserve.layers.rotary import RotaryEmbedding, rope_parameters
from pagedserve.models.llama import (
    AttentionOptions,
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    add_and_norm,
)
from pagedserve.utils.hf_config import head_dim, layer_sliding_window

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class Gemma2DecoderLayer(nn.Module):
    def __init__(self, config: "PretrainedConfig", self_attn: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = add_and_norm(self.input_layernorm, hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class Gemma2ForCausalLM(LlamaForCausalLM):
    qk_norm_class = GemmaRMSNorm  # Gemma 3's

    def make_model(self, config: "PretrainedConfig") -> nn.Module:
        rotaries = {
            layer_type: RotaryEmbedding(
                head_dim(config), config.max_position_embeddings, rope_parameters(config, layer_type)
            )
            for layer_type in set(config.layer_types)
        }
        return LlamaModel(
            config,
            lambda i: self.make_layer(config, i, rotaries[config.layer_types[i]]),
            GemmaRMSNorm,
            embed_scale=config.hidden_size**0.5,
        )

    def attention_options(self, config: "PretrainedConfig", layer_idx: int) -> AttentionOptions:
        return AttentionOptions(
            qkv_bias=getattr(config, "attention_bias", False),
            qk_norm=self.qk_norm(),
            scale=config.query_pre_attn_scalar**-0.5,
            sliding_window=layer_sliding_window(config, layer_idx, type(self).__name__),
            logits_soft_cap=getattr(config, "attn_logit_softcapping", None),
        )

    def make_mlp(self, config: "PretrainedConfig", layer_idx: int) -> nn.Module:
        activation = getattr(config, "hidden_activation", None) or config.hidden_act
        return LlamaMLP(config.hidden_size, config.intermediate_size, activation)

    def make_layer(
        self, config: "PretrainedConfig", layer_idx: int, rotary_emb: RotaryEmbedding
    ) -> nn.Module:
        attention = LlamaAttention(config, self.attention_options(config, layer_idx), rotary_emb)
        return Gemma2DecoderLayer(config, attention, self.make_mlp(config, layer_idx))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = getattr(self.config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def compute_logits_and_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        # NOTE: not the head's argmax: the cap's tanh can round logits it told apart to equal values.
        return self.compute_logits(hidden), None
