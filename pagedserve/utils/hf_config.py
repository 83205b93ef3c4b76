"""What a family's HF config means, read without torch: shared by the models (which build the layers) and
the sizing arithmetic (which counts them), so both read a config the same way."""

from typing import TYPE_CHECKING

from pagedserve.families import family

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
