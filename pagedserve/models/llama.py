"""Llama family (Llama 2/3, SmolLM2, TinyLlama): GQA, rope scaling, tied embeddings. The other families
reuse these blocks through the hooks of `LlamaForCausalLM` (attention options, the MLP of each layer, the
layer itself, the checkpoint's names) wherever their math is Llama's."""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.families import decoder_family
from pagedserve.layers.activation import gated_activation
from pagedserve.layers.attention import Attention
from pagedserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pagedserve.layers.layernorm import RMSNorm
from pagedserve.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    set_weight_loader,
)
from pagedserve.layers.rotary import RotaryEmbedding, rope_parameters
from pagedserve.models.interface import CausalLM, IntermediateTensors, model_stage
from pagedserve.utils.hf_config import head_dim, layer_sliding_window

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# (our parameter name, checkpoint tensor, shard id for the parameter's weight_loader)
ParamShard = tuple[str, torch.Tensor, object]


class MissingLayer(nn.Module):
    """Stands in for a layer of another pipeline stage, so layer indices stay the checkpoint's."""


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu") -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size)
        self.act_fn = gated_activation(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act_fn(self.gate_up_proj(x)))
        return out


@dataclass(frozen=True)
class AttentionOptions:
    """What one family's attention adds to Llama's."""

    qkv_bias: bool = False
    o_bias: bool = False
    num_kv_heads: int | None = None  # default config.num_key_value_heads
    qk_norm: type[RMSNorm] | None = None  # a norm over each head of q and k before rotary (Qwen3, Gemma 3)
    scale: float | None = None  # default head_dim ** -0.5
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    sinks: bool = False  # a learned softmax sink logit per head, `self_attn.sinks` (gpt-oss)


class LlamaAttention(nn.Module):
    def __init__(
        self, config: "PretrainedConfig", options: AttentionOptions, rotary_emb: RotaryEmbedding
    ) -> None:
        super().__init__()
        dim = head_dim(config)
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            dim,
            config.num_attention_heads,
            options.num_kv_heads or config.num_key_value_heads,
            bias=options.qkv_bias,
        )
        self.q_size = self.qkv_proj.num_heads * dim
        self.kv_size = self.qkv_proj.num_kv_heads * dim
        self.head_dim = dim
        self.o_proj = RowParallelLinear(config.num_attention_heads * dim, config.hidden_size, options.o_bias)
        self.rotary_emb = rotary_emb
        if options.qk_norm is not None:
            self.q_norm = options.qk_norm(dim, config.rms_norm_eps)
            self.k_norm = options.qk_norm(dim, config.rms_norm_eps)
        self.qk_norm = options.qk_norm is not None
        if options.sinks:
            self.sinks = nn.Parameter(torch.empty(self.qkv_proj.num_heads), requires_grad=False)
            set_weight_loader(self.sinks, self._load_sinks)
        self.attn = Attention(
            self.qkv_proj.num_heads,
            dim,
            options.scale or dim**-0.5,
            self.qkv_proj.num_kv_heads,
            options.sliding_window,
            options.logits_soft_cap,
            self.sinks if options.sinks else None,
        )

    def _load_sinks(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        """This rank's heads' sinks (the heads are split over the ranks as q's are)."""
        size = self.qkv_proj.num_heads
        param.data.copy_(loaded.narrow(0, self.qkv_proj.tp_rank * size, size))

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view_as(q)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view_as(k)
        q, k = self.rotary_emb(positions, q, k)
        out: torch.Tensor = self.o_proj(self.attn(q, k, v))
        return out


def add_and_norm(
    norm: RMSNorm, hidden: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(hidden + residual), hidden + residual); the first layer has no residual yet."""
    if residual is None:
        return norm(hidden), hidden
    normed: tuple[torch.Tensor, torch.Tensor] = norm(hidden, residual)
    return normed


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: "PretrainedConfig", self_attn: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = add_and_norm(self.input_layernorm, hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        out: torch.Tensor = self.mlp(hidden)
        return out, residual


class LlamaModel(nn.Module):
    """Embedding (times `embed_scale`, Gemma's), the decoder layers `make_layer(i)` and the final norm
    (`norm_class(hidden_size, norm_eps)`, default the config's rms_norm_eps): every family's trunk.
    A pipeline stage builds only its layers, the first stage alone the embedding, the last the norm.
    Layers map (positions, hidden, residual) -> (hidden, residual), the residual None before the first,
    so that the pair is all a stage hands the next."""

    def __init__(
        self,
        config: "PretrainedConfig",
        make_layer: Callable[[int], nn.Module],
        norm_class: Callable[[int, float], nn.Module] = RMSNorm,
        embed_scale: float | None = None,
        norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        self.stage = model_stage(config)
        if self.stage.is_first:
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.embed_scale = embed_scale
        self.layers = nn.ModuleList(
            make_layer(i) if self.stage.holds(i) else MissingLayer() for i in range(config.num_hidden_layers)
        )
        if self.stage.is_last:
            self.norm = norm_class(config.hidden_size, config.rms_norm_eps if norm_eps is None else norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """Normed hidden states on the last stage, else (hidden, residual) for the next stage, which
        passes them as `intermediate` instead of embedding `input_ids`. `inputs_embeds`: the embeddings
        to start from instead (an image model's, with its images' rows merged in)."""
        residual: torch.Tensor | None
        if intermediate is None:
            hidden: torch.Tensor = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
            residual = None
        else:
            hidden, residual = intermediate
        for layer in self.layers[self.stage.start : self.stage.end]:
            hidden, residual = layer(positions, hidden, residual)
        assert residual is not None, "every stage runs at least one layer"
        if not self.stage.is_last:
            return hidden, residual
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The tokens' embeddings (times `embed_scale`)."""
        hidden: torch.Tensor = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            # NOTE: HF rounds the scale to the activations' dtype first.
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        return hidden


class LlamaForCausalLM(CausalLM):
    """input_ids [T] and positions [T] of a flattened batch -> hidden states [T, hidden];
    `compute_logits` turns the selected rows into logits."""

    # The norm over each head of q and k, in the families whose entry (families.py) has one.
    qk_norm_class: type[RMSNorm] = RMSNorm
    # checkpoint name fragment -> (our fused parameter fragment, shard id)
    stacked_params = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.config = config
        self.facts = decoder_family(type(self).__name__)
        self.stage = model_stage(config)
        self.model = self.make_model(config)
        if self.stage.is_last:
            self.make_head(config)

    def make_head(self, config: "PretrainedConfig") -> None:
        """The LM head, tied to the embedding when the config says so (a classifier has another head)."""
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        # NOTE: at pp > 1 the last stage has no embedding: its head loads the embedding's tensor instead.
        if getattr(config, "tie_word_embeddings", False) and self.stage.is_first:
            embed_tokens = self.model.get_submodule("embed_tokens")
            assert isinstance(embed_tokens, VocabParallelEmbedding), "every family names its embedding so"
            self.lm_head.tie_to(embed_tokens)

    def make_model(self, config: "PretrainedConfig") -> nn.Module:
        rotary_emb = RotaryEmbedding(
            head_dim(config), config.max_position_embeddings, rope_parameters(config)
        )
        return LlamaModel(config, lambda i: self.make_layer(config, i, rotary_emb))

    def qk_norm(self) -> type[RMSNorm] | None:
        return self.qk_norm_class if self.facts.qk_norm else None

    def attention_options(self, config: "PretrainedConfig", layer_idx: int) -> AttentionOptions:
        return AttentionOptions(
            qkv_bias=self.facts.qkv_bias,
            qk_norm=self.qk_norm(),
            sliding_window=layer_sliding_window(config, layer_idx, type(self).__name__),
        )

    def make_mlp(self, config: "PretrainedConfig", layer_idx: int) -> nn.Module:
        return LlamaMLP(config.hidden_size, config.intermediate_size, getattr(config, "hidden_act", "silu"))

    def make_layer(
        self, config: "PretrainedConfig", layer_idx: int, rotary_emb: RotaryEmbedding
    ) -> nn.Module:
        attention = LlamaAttention(config, self.attention_options(config, layer_idx), rotary_emb)
        return LlamaDecoderLayer(config, attention, self.make_mlp(config, layer_idx))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.model(input_ids, positions, inputs_embeds=inputs_embeds)
        return hidden

    def forward_stage(
        self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: IntermediateTensors | None
    ) -> torch.Tensor | IntermediateTensors:
        """LlamaModel.forward: every family's trunk splits into stages the same way."""
        out: torch.Tensor | IntermediateTensors = self.model(input_ids, positions, intermediate)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def compute_logits_and_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.lm_head.compute_logits_and_greedy(hidden)

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[ParamShard]:
        """Where a checkpoint tensor (named by `checkpoint_name`) goes: nothing for tensors not kept, else
        one or more (parameter, tensor, shard id). Families with other checkpoint layouts override this."""
        if "rotary_emb.inv_freq" in name:
            return
        # NOTE: every lm_head tensor (a quantized head has several) when the head is the embedding.
        if (
            name.startswith("lm_head.")
            and getattr(self.config, "tie_word_embeddings", False)
            and self.stage.is_first
        ):
            return
        for fragment, (fused, shard) in self.stacked_params.items():
            if f".{fragment}." in name:
                yield name.replace(fragment, fused), tensor, shard
                return
        yield name, tensor, None

    def checkpoint_name(self, name: str) -> str:
        """Our name for the checkpoint tensor `name` (HF's): families whose checkpoints name the
        embedding, layers and norm otherwise (Falcon) map them to `model.embed_tokens`, `model.layers.N`
        and `model.norm` here, so one stage rule serves every family."""
        return name

    def stage_tensor_name(self, name: str) -> str | None:
        """The name (ours) this pipeline stage loads a checkpoint tensor (HF name) under: None for the
        embedding, layers, norm and head of other stages; the embedding as the head of a last stage whose
        head is tied."""
        stage, name = self.stage, self.checkpoint_name(name)
        if name.startswith("model.layers."):
            return name if stage.holds(int(name.split(".")[2])) else None
        if name.startswith("model.embed_tokens."):
            if stage.is_first:
                return name
            tied = stage.is_last and getattr(self.config, "tie_word_embeddings", False)
            return name.replace("model.embed_tokens.", "lm_head.", 1) if tied else None
        if name.startswith("model.norm.") or name.startswith("lm_head."):
            return name if stage.is_last else None
        return name

    def loads_tensor(self, name: str) -> bool:
        return self.stage_tensor_name(name) is not None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each checkpoint tensor (HF names) into its parameter shard. Returns the loaded names."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for checkpoint_name, checkpoint_tensor in weights:
            stage_name = self.stage_tensor_name(checkpoint_name)
            if stage_name is None:
                continue  # another pipeline stage's: never read
            for name, tensor, shard_id in self.checkpoint_tensors(stage_name, checkpoint_tensor):
                param = params[name]
                loader = getattr(param, "weight_loader", None)
                if loader is None:
                    param.data.copy_(tensor)
                else:
                    loader(param, tensor.to(param.dtype), shard_id)
                loaded.add(name)
        return loaded
