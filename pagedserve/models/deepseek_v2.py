"""DeepSeek V2 and V3 (and Kimi-K2-style configs built on V3): multi-head latent attention (MLA,
attention/mla.py: the KV cache holds one latent per token and layer, decodes attend over it with W_UK
absorbed into the query and W_UV into the output), YaRN rotary with its softmax mscale, and
mixture-of-experts layers from `first_k_dense_replace` on: routed experts chosen by group-limited top-k
(V2: softmax scores; V3: sigmoid scores with `e_score_correction_bias`, noaux_tc), their weights times
`routed_scaling_factor`, plus always-on shared experts. V3's multi-token-prediction layers (past
`num_hidden_layers`) are not loaded."""

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from pagedserve.attention.mla import MLAProjections
from pagedserve.layers.attention import Attention
from pagedserve.layers.layernorm import RMSNorm
from pagedserve.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from pagedserve.layers.moe import FusedMoE, select_grouped_experts
from pagedserve.layers.rotary import RotaryEmbedding, rope_parameters, yarn_softmax_scale
from pagedserve.logger import init_logger
from pagedserve.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel, ParamShard
from pagedserve.models.mixtral import expert_tensors
from pagedserve.quantization.base import linear
from pagedserve.utils.hf_config import is_deepseek_moe_layer

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = init_logger(__name__)

# HF's DeepSeek attention normalizes its latents with RMSNorm's default eps, not the config's.
_LATENT_NORM_EPS = 1e-6


class DeepseekMLAAttention(nn.Module):
    """q from the hidden state (through the q_lora_rank bottleneck when set); the latent c and the shared
    rotary key k_pe from kv_a_proj_with_mqa (replicated: every rank caches the whole latent); heads split
    over tensor-parallel ranks in q_b_proj, kv_b_proj and o_proj."""

    def __init__(self, config: "PretrainedConfig", rotary_emb: RotaryEmbedding, scale: float) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.kv_lora_rank, self.v_head_dim = config.kv_lora_rank, config.v_head_dim
        q_width = heads * (self.nope + self.rope)
        self.q_lora_rank = config.q_lora_rank
        if self.q_lora_rank:
            self.q_a_proj = ReplicatedLinear(hidden, self.q_lora_rank, config.attention_bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, _LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, q_width)
        else:
            self.q_proj = ColumnParallelLinear(hidden, q_width)
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden, self.kv_lora_rank + self.rope, config.attention_bias
        )
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, _LATENT_NORM_EPS)
        self.kv_b_proj = ColumnParallelLinear(self.kv_lora_rank, heads * (self.nope + self.v_head_dim))
        self.o_proj = RowParallelLinear(heads * self.v_head_dim, hidden, config.attention_bias)
        self.num_heads = self.kv_b_proj.output_size_per_partition // (self.nope + self.v_head_dim)
        self.rotary_emb = rotary_emb
        self.attn = Attention(
            self.num_heads, self.kv_lora_rank + self.rope, scale, 1, latent_dim=self.kv_lora_rank
        )
        self._projections: MLAProjections | None = None  # kv_b_proj split per head, once loaded

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        if self.q_lora_rank:
            q = self.q_b_proj(cast(torch.Tensor, self.q_a_layernorm(self.q_a_proj(hidden))))
        else:
            q = self.q_proj(hidden)
        q = q.view(num_tokens, self.num_heads, self.nope + self.rope)
        c, k_pe = self.kv_a_proj_with_mqa(hidden).split([self.kv_lora_rank, self.rope], dim=-1)
        c = cast(torch.Tensor, self.kv_a_layernorm(c))
        # NOTE: contiguous copies: the rotary kernel takes [T, heads * dim] rows of unit stride.
        q_pe, k_pe = self.rotary_emb(
            positions, q[..., self.nope :].reshape(num_tokens, -1), k_pe.contiguous()
        )
        q = torch.cat((q[..., : self.nope], q_pe.view(num_tokens, self.num_heads, self.rope)), dim=-1)
        if self._projections is None:
            self._projections = self._split_kv_b_proj(hidden)
        out = self.attn.forward_latent(q, torch.cat((c, k_pe), dim=-1), self._projections)
        projected: torch.Tensor = self.o_proj(out)
        return projected

    def _split_kv_b_proj(self, like: torch.Tensor) -> MLAProjections:
        """W_UK and W_UV per head, read from kv_b_proj itself (applied to the identity, in the activations'
        dtype), so that any weight format (float, quantized) gives its own matrix."""
        identity = torch.eye(self.kv_lora_rank, dtype=like.dtype, device=like.device)
        per_head = self.kv_b_proj(identity).T.reshape(self.num_heads, -1, self.kv_lora_rank)
        return MLAProjections.of(per_head, self.nope, linear)


class DeepseekRouter(nn.Module):
    """The router's weight (and V3's `e_score_correction_bias`), in float32 as HF keeps them."""

    def __init__(self, config: "PretrainedConfig", with_bias: bool) -> None:
        super().__init__()
        experts = config.n_routed_experts
        self.weight = nn.Parameter(torch.empty(experts, config.hidden_size, dtype=torch.float32), False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(experts, dtype=torch.float32), False) if with_bias else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x.float(), self.weight.float())


class DeepseekMoE(nn.Module):
    """Routed experts (FusedMoE) plus `n_shared_experts` always-on experts fused into one MLP."""

    def __init__(self, config: "PretrainedConfig", v3: bool) -> None:
        super().__init__()
        self.top_k, self.scaling = config.num_experts_per_tok, config.routed_scaling_factor
        # NOTE: V2's greedy method ranks every expert, whatever n_group says (HF's).
        grouped = v3 or getattr(config, "topk_method", None) == "group_limited_greedy"
        self.num_groups = (config.n_group or 1) if grouped else 1
        self.topk_groups = config.topk_group or 1
        # V2 never renormalizes (HF's); V3 when norm_topk_prob.
        self.renormalize = v3 and bool(config.norm_topk_prob)
        self.gate = DeepseekRouter(config, with_bias=v3)
        size = config.moe_intermediate_size
        self.experts = FusedMoE(config.n_routed_experts, config.hidden_size, size, config.hidden_act)
        shared = (config.n_shared_experts or 0) * size
        self.shared_experts = LlamaMLP(config.hidden_size, shared, config.hidden_act) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_grouped_experts(
            self.gate(x), self.top_k, self.num_groups, self.topk_groups, self.gate.e_score_correction_bias
        )
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        out: torch.Tensor = self.experts(x, (weights * self.scaling).to(x.dtype), ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    # q/k/v are no Llama projections here: only the MLPs' gate and up are fused.
    stacked_params = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
    v3 = False

    def make_model(self, config: "PretrainedConfig") -> nn.Module:
        params = rope_parameters(config)
        # NOTE: V2 rotates adjacent pairs (HF's complex rotation); V3 too unless rope_interleave is off
        # (HF's V3 then de-interleaves q and k alike, which leaves every q . k as it is).
        interleaved = not self.v3 or getattr(config, "rope_interleave", True)
        rotary = RotaryEmbedding(
            config.qk_rope_head_dim, config.max_position_embeddings, params, is_neox_style=not interleaved
        )
        scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5 * yarn_softmax_scale(params)
        return LlamaModel(
            config,
            lambda i: LlamaDecoderLayer(
                config, DeepseekMLAAttention(config, rotary, scale), self.make_mlp(config, i)
            ),
        )

    def make_mlp(self, config: "PretrainedConfig", layer_idx: int) -> nn.Module:
        if is_deepseek_moe_layer(config, layer_idx):
            return DeepseekMoE(config, self.v3)
        return super().make_mlp(config, layer_idx)

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[ParamShard]:
        expert = expert_tensors(name, tensor)
        if expert is not None:
            yield expert
        else:
            yield from super().checkpoint_tensors(name, tensor)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Skips (and logs) V3's multi-token-prediction layers, numbered after the model's own."""
        skipped: set[int] = set()

        def model_layers() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                parts = name.split(".")
                if name.startswith("model.layers.") and int(parts[2]) >= self.config.num_hidden_layers:
                    skipped.add(int(parts[2]))
                    continue
                yield name, tensor

        loaded = super().load_weights(model_layers())
        if skipped:
            logger.info(
                "Skipped the checkpoint's multi-token-prediction layer(s) %s (num_nextn_predict_layers): "
                "not used, as speculative decoding by MTP is not implemented.",
                sorted(skipped),
            )
        return loaded


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    v3 = True
