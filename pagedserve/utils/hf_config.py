"""What a family's HF config means, read without torch: shared by the models (which build the layers) and
the sizing arithmetic (which counts them), so both read a config the same way."""

from typing import TYPE_CHECKING

from pagedserve.families import decoder_family, family

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def layer_sliding_window(config: "PretrainedConfig", layer_idx: int, architecture: str) -> int | None:
    """The sliding window of layer `layer_idx`, as HF decides it (the family's `window_rule`): from
    `layer_types` ("sliding_attention") where the config lists them, else `sliding_window` on every layer."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    facts = family(architecture)
    every_layer = facts is not None and facts.window_rule == "every_layer"
    if not every_layer and layer_types is not None:
        return window if layer_types[layer_idx] == "sliding_attention" else None
    return window


def layer_windows(config: "PretrainedConfig", architecture: str) -> list[int | None]:
    """Every layer's sliding window (None: full attention)."""
    return [layer_sliding_window(config, i, architecture) for i in range(config.num_hidden_layers)]


def num_kv_heads(config: "PretrainedConfig", architecture: str) -> int:
    """KV heads of the model. Falcon's rule (HF's): grouped KV with the new architecture, one KV head for
    multi-query, else one per head."""
    facts = family(architecture)
    if facts is not None and facts.kv_heads_rule == "multi_query":
        if config.new_decoder_architecture or not config.multi_query:
            grouped: int = config.num_kv_heads or config.num_attention_heads
            return grouped
        return 1
    heads: int = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return heads


def head_dim(config: "PretrainedConfig") -> int:
    """Size of one attention head: the config's `head_dim`, else hidden size / heads."""
    dim: int = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return dim


def is_sparse_layer(config: "PretrainedConfig", layer_idx: int) -> bool:
    """Qwen-MoE: every `decoder_sparse_step`-th layer but `mlp_only_layers` is a mixture of experts."""
    return (
        layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
        and config.num_experts > 0
        and (layer_idx + 1) % getattr(config, "decoder_sparse_step", 1) == 0
    )


def falcon_two_layernorms(config: "PretrainedConfig") -> bool:
    """Falcon's new architecture normalizes attention and MLP inputs apart (num_ln_in_parallel_attn 2)."""
    return config.new_decoder_architecture and (config.num_ln_in_parallel_attn or 2) == 2


def falcon_parallel_attention(config: "PretrainedConfig") -> bool:
    """Attention and MLP read the same input and their outputs are summed (7B, and the new architecture)."""
    parallel: bool = config.new_decoder_architecture or config.parallel_attn
    return parallel


# gpt-oss: the values of its config fields that models/gpt_oss.py implements.
_GPT_OSS_ROPE_TYPES = ("yarn", "default")
_GPT_OSS_LAYER_TYPES = ("sliding_attention", "full_attention")


def gpt_oss_config_problem(config: "PretrainedConfig") -> str | None:
    """What a gpt-oss config.json asks for that is not implemented, naming the field and its value, or
    None."""
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in _GPT_OSS_ROPE_TYPES:
        return f"rope_parameters.rope_type={rope_type!r} (gpt-oss runs {' or '.join(_GPT_OSS_ROPE_TYPES)})"
    if rope_type == "yarn" and not rope.get("factor"):
        return f"rope_parameters.factor={rope.get('factor')!r} (yarn needs its scaling factor)"
    for layer_type in getattr(config, "layer_types", None) or []:
        if layer_type not in _GPT_OSS_LAYER_TYPES:
            return (
                f"layer_types entry {layer_type!r} (gpt-oss layers are {' or '.join(_GPT_OSS_LAYER_TYPES)})"
            )
    if config.num_experts_per_tok > config.num_local_experts:
        return (
            f"num_experts_per_tok={config.num_experts_per_tok} (more than its num_local_experts="
            f"{config.num_local_experts})"
        )
    return None


# DeepSeek V2/V3 (models/deepseek_v2.py): multi-head latent attention (MLA) and their expert routing.
_DEEPSEEK_ROPE_TYPES = ("default", "yarn")


def mla_latent_dims(config: "PretrainedConfig") -> tuple[int, int]:
    """(kv_lora_rank, qk_rope_head_dim): an MLA layer caches one latent of kv_lora_rank values and one
    rotary key of qk_rope_head_dim values per token, shared by all its heads."""
    return int(config.kv_lora_rank), int(config.qk_rope_head_dim)


def is_deepseek_moe_layer(config: "PretrainedConfig", layer_idx: int) -> bool:
    """DeepSeek: the layers from `first_k_dense_replace` on (every `moe_layer_freq`-th) are experts."""
    return (
        bool(config.n_routed_experts)
        and layer_idx >= (config.first_k_dense_replace or 0)
        and layer_idx % (getattr(config, "moe_layer_freq", 1) or 1) == 0
    )


def deepseek_unsupported(config: "PretrainedConfig", architecture: str) -> str | None:
    """Why a DeepSeek config asks for something models/deepseek_v2.py does not implement (the field and
    its value), or None."""
    latent = decoder_family(architecture).mla
    assert latent is not None, "an MLA family"
    scoring, methods = latent.scoring_funcs, latent.topk_methods
    for field, allowed in (("scoring_func", scoring), ("topk_method", methods)):
        value = getattr(config, field, None)
        if value not in allowed:
            supported = ", ".join(repr(v) for v in allowed if v is not None)
            return f"{field}={value!r} (supported for {architecture}: {supported})"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in _DEEPSEEK_ROPE_TYPES:
        return f"rope_type={rope_type!r} (supported: {', '.join(_DEEPSEEK_ROPE_TYPES)})"
    return None
