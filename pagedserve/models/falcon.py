"""Falcon, both layouts: 7B (parallel attention and MLP off one LayerNorm, multi-query attention) and the
40B/180B `new_decoder_architecture` (grouped KV, separate LayerNorms for attention and MLP); rotary
positions. The attention is Llama's (with biases where `bias` is set) and the trunk Llama's (so pipeline
stages split it as any family's); the checkpoint's fused query_key_value is split into q, k and v here,
whatever its layout. ALiBi variants are refused."""

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.errors import ConfigError
from pagedserve.layers.layernorm import LayerNorm
from pagedserve.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagedserve.layers.rotary import RotaryEmbedding, rope_parameters
from pagedserve.models.llama import AttentionOptions, LlamaAttention, LlamaForCausalLM, LlamaModel, ParamShard
from pagedserve.utils.hf_config import (
    falcon_parallel_attention,
    falcon_two_layernorms,
    head_dim,
    num_kv_heads,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# HF Falcon names -> ours (the Llama attention's, and the model's embed_tokens / layers / norm).
_RENAMES = [
    (r"^transformer\.word_embeddings\.", "model.embed_tokens."),
    (r"^transformer\.h\.", "model.layers."),
    (r"^transformer\.ln_f\.", "model.norm."),
    (r"\.self_attention\.query_key_value\.", ".self_attn.qkv_proj."),
    (r"\.self_attention\.dense\.", ".self_attn.o_proj."),
]


class FalconMLP(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        ffn = config.ffn_hidden_size or 4 * config.hidden_size
        self.dense_h_to_4h = ColumnParallelLinear(config.hidden_size, ffn, bias=config.bias)
        self.dense_4h_to_h = RowParallelLinear(ffn, config.hidden_size, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))
        return out


class FalconDecoderLayer(nn.Module):
    """Falcon's layer on Llama's residual stream: it returns its branch outputs and the stream so far
    apart, and the next layer (or the final norm) adds them, in HF's order of the sums."""

    def __init__(self, config: "PretrainedConfig", self_attn: nn.Module) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = FalconMLP(config)
        size, eps = config.hidden_size, config.layer_norm_epsilon
        self.two_layernorms = falcon_two_layernorms(config)
        self.parallel = falcon_parallel_attention(config)
        if self.two_layernorms:
            self.ln_attn, self.ln_mlp = LayerNorm(size, eps), LayerNorm(size, eps)
        else:
            self.input_layernorm = LayerNorm(size, eps)
            if not self.parallel:
                self.post_attention_layernorm = LayerNorm(size, eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stream = hidden if residual is None else hidden + residual
        if self.two_layernorms:
            attn_in, mlp_in = self.ln_attn(stream), self.ln_mlp(stream)
        else:
            attn_in = mlp_in = self.input_layernorm(stream)
        attn_out: torch.Tensor = self.self_attn(positions, attn_in)
        if self.parallel:
            mlp_out: torch.Tensor = self.mlp(mlp_in)
            return mlp_out + attn_out, stream  # HF: (mlp + attention) + the layer's input
        stream = attn_out + stream
        return self.mlp(self.post_attention_layernorm(stream)), stream


class FalconForCausalLM(LlamaForCausalLM):
    def make_model(self, config: "PretrainedConfig") -> nn.Module:
        if config.alibi:
            raise ConfigError(
                "Falcon with alibi=true (ALiBi position biases, e.g. falcon-rw) is not "
                "supported: pagedserve runs the rotary Falcon models (7B, 40B, 180B)."
            )
        rotary_emb = RotaryEmbedding(
            head_dim(config), config.max_position_embeddings, rope_parameters(config)
        )
        options = AttentionOptions(
            qkv_bias=config.bias, o_bias=config.bias, num_kv_heads=num_kv_heads(config, type(self).__name__)
        )
        return LlamaModel(
            config,
            lambda i: FalconDecoderLayer(config, LlamaAttention(config, options, rotary_emb)),
            LayerNorm,
            norm_eps=config.layer_norm_epsilon,
        )

    def checkpoint_name(self, name: str) -> str:
        for pattern, replacement in _RENAMES:
            name = re.sub(pattern, replacement, name)
        return name

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[ParamShard]:
        if ".qkv_proj." in name:
            yield from ((name, part, shard) for part, shard in self._split_qkv(tensor))
        else:
            yield from super().checkpoint_tensors(name, tensor)

    def _split_qkv(self, tensor: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
        """query_key_value rows -> q, k, v rows. Layouts: new architecture: per KV group, its query heads
        then one key and one value head; multi-query: every query head, then the key, then the value;
        else per head, its query, key and value."""
        config, dim = self.config, head_dim(self.config)
        heads, kv_heads = config.num_attention_heads, num_kv_heads(config, type(self).__name__)
        # [fused heads, head_dim, (hidden)]; NOTE: a torch function reads a lazy checkpoint tensor
        rows = torch.reshape(tensor, (-1, dim, *tensor.shape[1:]))
        if config.new_decoder_architecture:
            grouped = rows.view(kv_heads, heads // kv_heads + 2, *rows.shape[1:])
            q, k, v = grouped[:, :-2], grouped[:, -2], grouped[:, -1]
        elif config.multi_query:
            q, k, v = rows[:heads], rows[heads], rows[heads + 1]
        else:
            per_head = rows.view(heads, 3, *rows.shape[1:])
            q, k, v = per_head[:, 0], per_head[:, 1], per_head[:, 2]
        return [
            (part.reshape(-1, *tensor.shape[1:]), shard) for part, shard in ((q, "q"), (k, "k"), (v, "v"))
        ]
