"""The sizes of a model that memory depends on, read from its transformers config as its family lays it
out (no torch): the parameters one tensor-parallel rank and pipeline stage holds (every family's layers,
dense or mixture-of-experts, MLA), the matrices a quantized checkpoint packs, and an estimate of the peak
activations. `pagedserve plan` counts weights and activations with it; tests check it against the models.
"""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pagedserve.config.kv_layout import kv_heads_per_rank
from pagedserve.config.parallel import PipelineStage
from pagedserve.families import NormPlacement, decoder_family
from pagedserve.utils import cdiv
from pagedserve.utils.hf_config import (
    falcon_parallel_attention,
    falcon_two_layernorms,
    head_dim,
    is_deepseek_moe_layer,
    is_sparse_layer,
    num_kv_heads,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention's sizes (DeepSeek V2/V3; q_lora_rank 0: one q_proj)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @classmethod
    def of(cls, hf_config: "PretrainedConfig") -> "MLAShape":
        return cls(
            hf_config.q_lora_rank or 0,
            hf_config.kv_lora_rank,
            hf_config.qk_nope_head_dim,
            hf_config.qk_rope_head_dim,
            hf_config.v_head_dim,
        )

    def linear_matrices(self, hidden: int, heads: int) -> list[tuple[int, int]]:
        """(rows, columns) of the attention projections on a rank holding `heads` heads: q (or q_a, q_b),
        kv_a (replicated), kv_b, o."""
        q_out = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        q = [(self.q_lora_rank, hidden), (q_out, self.q_lora_rank)] if self.q_lora_rank else [(q_out, hidden)]
        return q + [
            (self.kv_lora_rank + self.qk_rope_head_dim, hidden),
            (heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank),
            (hidden, heads * self.v_head_dim),
        ]

    def parameters(self, hidden: int, heads: int) -> int:
        """The projections and the two latent norms."""
        return sum(rows * cols for rows, cols in self.linear_matrices(hidden, heads)) + (
            self.q_lora_rank + self.kv_lora_rank
        )


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a model that memory depends on (every supported family: dense or mixture-of-experts
    MLPs, all experts resident)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int  # of the dense MLP layers
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool = False
    norms_per_layer: int = 2
    norm_params: int = 1  # per element of a norm: 1 (RMSNorm), 2 (LayerNorm with bias: Falcon)
    mlp_matrices: int = 3  # gate, up, down (gated) or up, down (Falcon)
    linear_bias: bool = False  # Falcon's `bias`: o_proj and the MLP too
    moe_layers: tuple[int, ...] = ()  # the indices of the mixture-of-experts layers
    num_experts: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    sinks: bool = False  # a sink logit per head (gpt-oss)
    output_and_expert_biases: bool = False  # o_proj's, the router's and each expert's gate/up/down biases
    has_embedding: bool = True  # False on a pipeline stage after the first
    has_head: bool = True  # the final norm and LM head; False on a pipeline stage before the last
    first_layer: int = 0  # the model's index of the first decoder layer held (a pipeline stage's start)
    mla: MLAShape | None = None  # multi-head latent attention (DeepSeek) instead of q/k/v projections
    shared_expert_gate: bool = True  # Qwen2-MoE's sigmoid gate on its shared expert (DeepSeek has none)
    router_bias: bool = False  # DeepSeek V3's e_score_correction_bias, one per expert

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    def stage(self, stage: PipelineStage) -> "ModelShape":
        """The part one pipeline stage holds: its layers (and their experts)."""
        if stage.num_stages == 1:
            return self
        return replace(
            self,
            num_layers=stage.end - stage.start,
            first_layer=stage.start,
            moe_layers=tuple(layer for layer in self.moe_layers if stage.holds(layer)),
            has_embedding=stage.is_first,
            has_head=stage.is_last,
        )

    @classmethod
    def from_hf_config(cls, hf_config: "PretrainedConfig", architecture: str) -> "ModelShape":
        """Read a transformers config (config.json's fields), as the family (families.py) lays it out."""
        facts = decoder_family(architecture)
        heads, layers = hf_config.num_attention_heads, hf_config.num_hidden_layers
        linear_bias = facts.bias_field is not None and bool(getattr(hf_config, facts.bias_field))
        num_experts = (
            getattr(hf_config, "num_local_experts", None) or getattr(hf_config, "num_experts", 0) or 0
        )
        moe_layers: tuple[int, ...] = ()
        moe_size = 0
        deepseek = facts.mla is not None
        if deepseek:
            num_experts = hf_config.n_routed_experts
            moe_layers = tuple(i for i in range(layers) if is_deepseek_moe_layer(hf_config, i))
            moe_size = hf_config.moe_intermediate_size
        elif facts.moe is not None and (facts.moe.every_layer or num_experts):
            moe_layers = tuple(
                i for i in range(layers) if facts.moe.every_layer or is_sparse_layer(hf_config, i)
            )
            moe_size = getattr(hf_config, facts.moe.expert_size_field)
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=getattr(hf_config, facts.mlp_size_field) or 4 * hf_config.hidden_size,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=num_kv_heads(hf_config, architecture),
            head_dim=head_dim(hf_config),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            qkv_bias=facts.qkv_bias or linear_bias,
            qk_norm=facts.qk_norm,
            norms_per_layer=_norms_per_layer(facts.norm_placement, hf_config),
            norm_params=2 if facts.layer_norm else 1,
            mlp_matrices=3 if facts.gated_mlp else 2,
            linear_bias=linear_bias,
            moe_layers=moe_layers,
            num_experts=num_experts if moe_layers else 0,
            moe_intermediate_size=moe_size,
            shared_expert_intermediate_size=(hf_config.n_shared_experts or 0) * moe_size
            if deepseek
            else getattr(hf_config, "shared_expert_intermediate_size", 0) or 0,
            sinks=facts.sinks,
            output_and_expert_biases=facts.output_and_expert_biases,
            mla=MLAShape.of(hf_config) if deepseek else None,
            shared_expert_gate=not deepseek,
            router_bias=facts.mla is not None and facts.mla.correction_bias,
        )

    def kv_heads_per_rank(self, tp: int) -> int:
        return kv_heads_per_rank(self.num_kv_heads, tp)

    def num_parameters(self, tp: int = 1) -> int:
        """Parameters held by one of `tp` ranks: the vocabulary split (padded) over the ranks, linear
        layers (experts included) split, norms and MoE routers replicated, a tied LM head counted once."""
        layers = sum(self.layer_parameters(tp, index) for index in self.layer_indices)
        # NOTE: a tied head is the embedding, unless a later pipeline stage holds it (as a copy).
        own_head = self.has_head and not (self.tie_word_embeddings and self.has_embedding)
        vocab = cdiv(self.vocab_size, tp) * self.hidden_size * (int(self.has_embedding) + int(own_head))
        return vocab + layers + (self.norm_params * self.hidden_size if self.has_head else 0)

    @property
    def layer_indices(self) -> range:
        """The model's indices of the decoder layers this shape holds."""
        return range(self.first_layer, self.first_layer + self.num_layers)

    def layer_parameters(self, tp: int, index: int) -> int:
        """Parameters of decoder layer `index` on one of `tp` ranks: attention, norms, and its dense MLP
        or its experts (router and shared expert included)."""
        hidden, head_dim = self.hidden_size, self.head_dim
        qkv_out = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * head_dim
        attention = (
            hidden * qkv_out
            + (qkv_out if self.qkv_bias else 0)  # qkv_proj
            + self.num_heads * head_dim // tp * hidden  # o_proj
            + (hidden if self.linear_bias else 0)
            + (2 * head_dim if self.qk_norm else 0)
            + (self.num_heads // tp if self.sinks else 0)
            + (hidden if self.output_and_expert_biases else 0)  # o_proj's bias
        )
        if self.mla is not None:
            attention = self.mla.parameters(hidden, self.num_heads // tp)
        norms = self.norms_per_layer * self.norm_params * hidden
        if index not in self.moe_layers:
            return attention + norms + self._mlp(self.intermediate_size, tp)
        # router (and its bias) + experts
        moe = self.num_experts * (hidden + int(self.router_bias) + self._mlp(self.moe_intermediate_size, tp))
        if self.output_and_expert_biases:  # the router's, each expert's gate/up (split) and down (whole)
            moe += self.num_experts * (1 + 2 * self.moe_intermediate_size // tp + hidden)
        if self.shared_expert_intermediate_size:
            moe += self._mlp(self.shared_expert_intermediate_size, tp)  # shared expert(s)
            moe += hidden if self.shared_expert_gate else 0
        return attention + norms + moe

    def linear_matrices(self, tp: int, index: int) -> list[tuple[int, int]]:
        """(rows, columns) of decoder layer `index`'s attention projections and dense MLP matrices on one
        of `tp` ranks (no experts): the matrices a GPTQ/AWQ/fp8 checkpoint quantizes."""
        hidden = self.hidden_size
        qkv_out = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * self.head_dim
        attention_width = self.num_heads * self.head_dim // tp
        matrices = [(qkv_out, hidden), (hidden, attention_width)]  # qkv_proj, o_proj
        if self.mla is not None:
            matrices = self.mla.linear_matrices(hidden, self.num_heads // tp)
        if index not in self.moe_layers:
            intermediate = self.intermediate_size // tp
            # gate and up (or Falcon's up alone) read the hidden state, down the intermediate one
            matrices += [(intermediate, hidden)] * (self.mlp_matrices - 1) + [(hidden, intermediate)]
        return matrices

    def expert_matrices(self, tp: int, index: int) -> list[tuple[int, int]]:
        """(rows, columns) of decoder layer `index`'s expert matrices on one of `tp` ranks, all experts:
        the matrices an MXFP4 checkpoint quantizes."""
        if index not in self.moe_layers:
            return []
        intermediate = self.moe_intermediate_size // tp
        gate_up = [(intermediate, self.hidden_size)] * (self.mlp_matrices - 1)
        return (gate_up + [(self.hidden_size, intermediate)]) * self.num_experts

    def _mlp(self, intermediate_size: int, tp: int) -> int:
        per_rank = intermediate_size // tp
        bias = per_rank + self.hidden_size if self.linear_bias else 0
        return self.mlp_matrices * self.hidden_size * per_rank + bias

    def activation_bytes(self, num_tokens: int, tp: int, dtype_bytes: int) -> int:
        """An estimate of the peak activations of a forward over `num_tokens` tokens (the engine
        measures it instead, with a profiling run): the residual and hidden states, the q/k/v and
        attention outputs, the MLP's gate/up output and its activation, and one row of float32 logits."""
        qkv = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * self.head_dim
        per_token = (
            3 * self.hidden_size
            + qkv
            + self.num_heads // tp * self.head_dim
            + 3 * max(self.intermediate_size, self.moe_intermediate_size) // tp
        )
        return num_tokens * per_token * dtype_bytes + 4 * self.vocab_size


def _norms_per_layer(placement: NormPlacement, hf_config: "PretrainedConfig") -> int:
    """Norms per decoder layer: two before attention and MLP, Gemma's four, Falcon's one before parallel
    attention and MLP (else two)."""
    if placement == "sandwich":
        return 4
    if (
        placement == "parallel"
        and falcon_parallel_attention(hf_config)
        and not falcon_two_layernorms(hf_config)
    ):
        return 1
    return 2
