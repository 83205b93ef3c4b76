"""The HF config of a GGUF file: transformers' reading of its metadata, completed where transformers
misses what llama.cpp's converter wrote (Mixtral's experts, Qwen-MoE's expert sizes, a BERT's or a
gpt-oss's whole config, an embedding model's pooling type), for the architectures (`general.architecture`) pagedserve
loads; any other is refused with that list."""

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pagedserve.errors import ConfigError
from pagedserve.families import GGUF_ARCHITECTURES, gguf_family
from pagedserve.utils.gguf_bert import bert_config
from pagedserve.utils.gguf_metadata import metadata_int, metadata_string
from pagedserve.utils.gguf_metadata_config import metadata_config
from pagedserve.utils.gguf_tensors import read_gguf

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# llama.cpp's `{arch}.pooling_type` values (its enum llama_pooling_type) -> their names; 0 (none) is none.
_GGUF_POOLING_TYPES = {1: "MEAN", 2: "CLS", 3: "LAST", 4: "RANK"}


def gguf_hf_config(directory: str, name: str) -> "PretrainedConfig":
    """The transformers config of `directory`/`name`. Raises ConfigError for an architecture pagedserve
    does not load, naming the ones it does."""
    from transformers import AutoConfig

    path = os.path.join(directory, name)
    metadata = read_gguf(path).metadata
    arch = metadata_string(metadata, "general.architecture")
    facts = gguf_family(arch)
    if facts is None or facts.gguf is None:
        supported = "; ".join(f"{key} ({gguf.holds})" for key, gguf in GGUF_ARCHITECTURES.items())
        raise ConfigError(
            f"GGUF architecture {arch!r} (general.architecture of {name}) is not supported. Supported GGUF "
            f"architectures: {supported}. Other families load from a HF folder (--model)."
        )
    if facts.encoder:  # NOTE: transformers reads no encoder (BERT) GGUF
        config = bert_config(read_gguf(path, arrays=True).metadata, facts.architecture)
    elif facts.gguf.config_from_metadata:
        config = metadata_config(read_gguf(path, arrays=facts.mrope), facts, arch)
    else:
        config = AutoConfig.from_pretrained(directory, gguf_file=name)
    if facts.gguf.sparse_architecture is not None:
        config = _as_sparse(config, metadata, arch, facts.gguf.sparse_architecture)
    if facts.gguf.query_scalar_hidden_per_head_layers is not None:
        config.query_pre_attn_scalar = (
            config.hidden_size // config.num_attention_heads
            if config.num_hidden_layers == facts.gguf.query_scalar_hidden_per_head_layers
            else config.head_dim
        )
    if facts.gguf.expert_sizes_in_metadata:
        config = _with_qwen_moe_sizes(
            config, metadata, arch, shared_expert=facts.moe is not None and facts.moe.shared_expert
        )
    pooling = _GGUF_POOLING_TYPES.get(metadata_int(metadata, f"{arch}.pooling_type", 0))
    if pooling is not None:  # the pooling runner's default for this model (config/pooling.py)
        config.gguf_pooling_type = pooling
    return config


def _as_sparse(
    config: "PretrainedConfig", metadata: Mapping[str, object], arch: str, sparse_architecture: str
) -> "PretrainedConfig":
    """llama.cpp stores Mixtral as the dense family's architecture with `<arch>.expert_count` experts,
    which transformers reads as a dense Llama: such a config becomes the MixtralConfig it describes."""
    if metadata_int(metadata, f"{arch}.expert_count", 0) == 0:
        return config
    from transformers import MixtralConfig

    settings = {
        key: value for key, value in config.to_dict().items() if key not in ("model_type", "architectures")
    }
    return MixtralConfig(
        **settings,
        num_local_experts=metadata_int(metadata, f"{arch}.expert_count"),
        num_experts_per_tok=metadata_int(metadata, f"{arch}.expert_used_count"),
        sliding_window=settings.pop("sliding_window", None),  # Mixtral's GGUFs carry no window
        architectures=[sparse_architecture],
    )


def _with_qwen_moe_sizes(
    config: "PretrainedConfig", metadata: Mapping[str, object], arch: str, shared_expert: bool
) -> "PretrainedConfig":
    """transformers reads a Qwen2/3-MoE GGUF's expert counts but not the experts' sizes, leaving the
    config class's defaults (Qwen1.5-MoE-A2.7B's). The sizes come from llama.cpp's keys, as its converter
    writes them; every layer is sparse (llama.cpp builds no dense layer for these architectures)."""
    config.num_experts = metadata_int(metadata, f"{arch}.expert_count")
    config.num_experts_per_tok = metadata_int(metadata, f"{arch}.expert_used_count")
    config.moe_intermediate_size = metadata_int(metadata, f"{arch}.expert_feed_forward_length")
    config.decoder_sparse_step = 1
    config.mlp_only_layers = []
    if shared_expert:  # 0: no shared expert (the model builds none)
        config.shared_expert_intermediate_size = metadata_int(
            metadata, f"{arch}.expert_shared_feed_forward_length", 0
        )
    norm = metadata.get(f"{arch}.expert_weights_norm")
    if norm is not None:  # else the family's rule: llama.cpp renormalizes Qwen3-MoE's top-k, not Qwen2's
        config.norm_topk_prob = bool(norm)
    return config
