"""GGUF files whose config transformers cannot read (families.GGUFFacts.config_from_metadata): the HF
config built from llama.cpp's `<arch>.*` keys as its converter writes them, and the byte-level BPE
tokenizer from `tokenizer.ggml.*`. Read so far: gpt-oss (the family with attention sinks), DeepSeek (MLA)
and Qwen2.5-VL's language model (M-RoPE); another such architecture is refused, naming it."""

from collections.abc import Mapping
from typing import TYPE_CHECKING

from gguf import GGMLQuantizationType

from pagedserve.errors import ConfigError
from pagedserve.families import FAMILIES, FamilyFacts
from pagedserve.utils.gguf_metadata import metadata_int
from pagedserve.utils.gguf_tensors import GGUFFile

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

_GGUF_TOKEN_CONTROL = 3  # llama.cpp's token type of special tokens


def _float(metadata: Mapping[str, object], key: str, default: float | None = None) -> float:
    value = metadata.get(key, default)
    if not isinstance(value, int | float):
        raise ConfigError(f"The GGUF metadata key {key!r} holds {value!r}, not a number.")
    return float(value)


def _shared_fields(file: GGUFFile, arch: str) -> dict[str, object]:
    """The config fields every architecture here reads alike: context, norm epsilon, tied head, bos/eos."""
    metadata = file.metadata
    return dict(
        max_position_embeddings=metadata_int(metadata, f"{arch}.context_length"),
        rms_norm_eps=_float(metadata, f"{arch}.attention.layer_norm_rms_epsilon"),
        tie_word_embeddings=all(tensor.name != "output.weight" for tensor in file.tensors),
        bos_token_id=metadata_int(metadata, "tokenizer.ggml.bos_token_id", -1),
        eos_token_id=metadata_int(metadata, "tokenizer.ggml.eos_token_id", -1),
    )


def metadata_config(file: GGUFFile, facts: FamilyFacts, arch: str) -> "PretrainedConfig":
    """The HF config of `file`, of family `facts` (GGUF architecture `arch`)."""
    if facts.mla is not None:
        return _latent_config(file, arch)
    if facts.mrope:
        return _mrope_text_config(file, arch)
    if not facts.sinks:
        raise ConfigError(
            f"GGUF architecture {arch!r} has no config reader yet; load its HF folder (--model)."
        )
    return _gpt_oss_config(file, facts, arch)


def _mrope_text_config(file: GGUFFile, arch: str) -> "PretrainedConfig":
    """Qwen2.5-VL's language model (`file` read with its arrays): a Qwen2 whose rotary halves are split
    in `rope.dimension_sections` (temporal, height, width; llama.cpp pads them to four). Alone it is a
    Qwen2 (one position for all three); --mmproj makes it the language model of the image model."""
    from transformers import AutoConfig, Qwen2Config

    metadata = file.metadata
    sections = [int(s) for s in metadata.get(f"{arch}.rope.dimension_sections", [])]  # type: ignore[attr-defined]
    if len(sections) < 3:
        raise ConfigError(
            f"The GGUF metadata lacks {arch}.rope.dimension_sections (M-RoPE's three sections)."
        )
    names = {tensor.name: tensor for tensor in file.tensors}
    return AutoConfig.for_model(
        Qwen2Config.model_type,
        vocab_size=names["token_embd.weight"].shape[-1],  # GGUF order: innermost first
        hidden_size=metadata_int(metadata, f"{arch}.embedding_length"),
        intermediate_size=metadata_int(metadata, f"{arch}.feed_forward_length"),
        num_hidden_layers=metadata_int(metadata, f"{arch}.block_count"),
        num_attention_heads=metadata_int(metadata, f"{arch}.attention.head_count"),
        num_key_value_heads=metadata_int(metadata, f"{arch}.attention.head_count_kv"),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": _float(metadata, f"{arch}.rope.freq_base", 10000.0),
            "mrope_section": [s for s in sections[:3]],
        },
        architectures=[next(f.architecture for f in FAMILIES if f.model_type == Qwen2Config.model_type)],
        **_shared_fields(file, arch),
    )


# llama.cpp's expert gating functions (its enum llama_expert_gating_func_type); absent: softmax (its default)
_GATING_FUNCS = {1: "softmax", 2: "sigmoid"}


def _latent_config(file: GGUFFile, arch: str) -> "PretrainedConfig":
    """DeepSeek V2/V3 (MLA). The scoring of the experts picks the family (sigmoid, with its correction
    bias: V3, top-k by noaux_tc; softmax: V2, group-limited when the experts are grouped). YaRN's mscale is
    stored once (`yarn_log_multiplier`, 0.1 x mscale_all_dim): mscale is taken equal, as DeepSeek's
    configs have it."""
    from transformers import AutoConfig

    metadata = file.metadata
    gating = metadata_int(metadata, f"{arch}.expert_gating_func", 1)
    if gating not in _GATING_FUNCS:
        raise ConfigError(
            f"GGUF metadata {arch}.expert_gating_func={gating} is not implemented (1 softmax, 2 sigmoid)."
        )
    scoring = _GATING_FUNCS[gating]
    facts = next(f for f in FAMILIES if f.mla is not None and scoring in f.mla.scoring_funcs)
    groups = metadata_int(metadata, f"{arch}.expert_group_count", 1)
    topk_method = "noaux_tc" if scoring == "sigmoid" else "group_limited_greedy" if groups > 1 else "greedy"
    rope_dim = metadata_int(metadata, f"{arch}.rope.dimension_count")
    heads = metadata_int(metadata, f"{arch}.attention.head_count")
    return AutoConfig.for_model(
        facts.model_type,
        vocab_size=metadata_int(metadata, f"{arch}.vocab_size"),
        hidden_size=metadata_int(metadata, f"{arch}.embedding_length"),
        intermediate_size=metadata_int(metadata, f"{arch}.feed_forward_length"),
        moe_intermediate_size=metadata_int(metadata, f"{arch}.expert_feed_forward_length"),
        num_hidden_layers=metadata_int(metadata, f"{arch}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=heads,  # NOTE: llama.cpp writes 1 (one shared latent); HF one per head
        kv_lora_rank=metadata_int(metadata, f"{arch}.attention.kv_lora_rank"),
        q_lora_rank=metadata_int(metadata, f"{arch}.attention.q_lora_rank", 0) or None,
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=metadata_int(metadata, f"{arch}.attention.key_length_mla") - rope_dim,
        v_head_dim=metadata_int(metadata, f"{arch}.attention.value_length_mla"),
        n_routed_experts=metadata_int(metadata, f"{arch}.expert_count"),
        num_experts_per_tok=metadata_int(metadata, f"{arch}.expert_used_count"),
        n_group=groups,
        topk_group=metadata_int(metadata, f"{arch}.expert_group_used_count", 1),
        n_shared_experts=metadata_int(metadata, f"{arch}.expert_shared_count", 0),
        first_k_dense_replace=metadata_int(metadata, f"{arch}.leading_dense_block_count", 0),
        routed_scaling_factor=_float(metadata, f"{arch}.expert_weights_scale", 1.0),
        norm_topk_prob=bool(metadata.get(f"{arch}.expert_weights_norm", False)),
        scoring_func=scoring,
        topk_method=topk_method,
        rope_parameters=_latent_rope(file, arch),
        architectures=[facts.architecture],
        **_shared_fields(file, arch),
    )


def _latent_rope(file: GGUFFile, arch: str) -> dict[str, object]:
    """DeepSeek's rope parameters: plain or YaRN (mscale stored once, `yarn_log_multiplier`)."""
    metadata = file.metadata
    rope: dict[str, object] = {"rope_type": "default"}
    rope_type = metadata.get(f"{arch}.rope.scaling.type", "none")
    if rope_type == "yarn":
        mscale = _float(metadata, f"{arch}.rope.scaling.yarn_log_multiplier", 0.0) / 0.1
        rope = {
            "rope_type": "yarn",
            "factor": _float(metadata, f"{arch}.rope.scaling.factor"),
            "original_max_position_embeddings": metadata_int(
                metadata, f"{arch}.rope.scaling.original_context_length"
            ),
            "mscale": mscale,
            "mscale_all_dim": mscale,
        }
    elif rope_type != "none":
        raise ConfigError(
            f"GGUF metadata {arch}.rope.scaling.type={rope_type!r} is not implemented for DeepSeek (yarn or "
            "none)."
        )
    rope["rope_theta"] = _float(metadata, f"{arch}.rope.freq_base", 10000.0)
    return rope


def _gpt_oss_config(file: GGUFFile, facts: FamilyFacts, arch: str) -> "PretrainedConfig":
    """gpt-oss: alternating sliding-window and full layers (the first sliding, as llama.cpp builds them),
    YaRN without truncation (llama.cpp's), experts in MXFP4 kept packed (`quantization_config`) when the
    file stores them so."""
    from transformers import AutoConfig

    metadata = file.metadata
    layers = metadata_int(metadata, f"{arch}.block_count")
    rope_type = metadata.get(f"{arch}.rope.scaling.type", "none")
    rope: dict[str, object] = {"rope_type": "default"}
    if rope_type == "yarn":
        rope = {
            "rope_type": "yarn",
            "factor": _float(metadata, f"{arch}.rope.scaling.factor"),
            "beta_fast": _float(metadata, f"{arch}.rope.scaling.yarn_beta_fast", 32.0),
            "beta_slow": _float(metadata, f"{arch}.rope.scaling.yarn_beta_slow", 1.0),
            "original_max_position_embeddings": metadata_int(
                metadata, f"{arch}.rope.scaling.original_context_length"
            ),
            "truncate": False,
        }
    elif rope_type != "none":
        raise ConfigError(
            f"GGUF metadata {arch}.rope.scaling.type={rope_type!r} is not implemented for gpt-oss (yarn or none)."
        )
    rope["rope_theta"] = _float(metadata, f"{arch}.rope.freq_base", 10000.0)
    names = {tensor.name: tensor for tensor in file.tensors}
    embedding = names["token_embd.weight"]
    experts = names["blk.0.ffn_down_exps.weight"]
    config = AutoConfig.for_model(
        facts.model_type,
        vocab_size=embedding.shape[-1],  # GGUF order: innermost first
        hidden_size=metadata_int(metadata, f"{arch}.embedding_length"),
        intermediate_size=metadata_int(metadata, f"{arch}.expert_feed_forward_length"),
        num_hidden_layers=layers,
        num_attention_heads=metadata_int(metadata, f"{arch}.attention.head_count"),
        num_key_value_heads=metadata_int(metadata, f"{arch}.attention.head_count_kv"),
        head_dim=metadata_int(metadata, f"{arch}.attention.key_length"),
        num_local_experts=metadata_int(metadata, f"{arch}.expert_count"),
        num_experts_per_tok=metadata_int(metadata, f"{arch}.expert_used_count"),
        sliding_window=metadata_int(metadata, f"{arch}.attention.sliding_window"),
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        rope_parameters=rope,
        architectures=[facts.architecture],
        **_shared_fields(file, arch),
    )
    if experts.tensor_type == GGMLQuantizationType.MXFP4:
        config.quantization_config = {"quant_method": "gguf", "packed_experts": "mxfp4"}
    return config


def bpe_tokenizer(metadata: Mapping[str, object]) -> "PreTrainedTokenizerBase":
    """The byte-level BPE tokenizer (`tokenizer.ggml.model` gpt2) of metadata read with its arrays.
    NOTE: words are split by GPT-2's byte-level rule; `tokenizer.ggml.pre` names the model's own split,
    which only matters where the two differ (digits, long whitespace runs)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ConfigError(f"GGUF tokenizer.ggml.model={model!r} is not read here (gpt2, byte-level BPE, is).")
    tokens = [str(token) for token in metadata["tokenizer.ggml.tokens"]]  # type: ignore[attr-defined]
    pairs = [str(merge).split(" ", 1) for merge in metadata.get("tokenizer.ggml.merges", [])]  # type: ignore[attr-defined]
    merges = [(first, second) for first, second in pairs]
    types = list(metadata.get("tokenizer.ggml.token_type", []))  # type: ignore[call-overload]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True) for i, kind in enumerate(types) if kind == _GGUF_TOKEN_CONTROL]
    )

    def special(key: str) -> str | None:
        index = metadata_int(metadata, f"tokenizer.ggml.{key}", -1)
        return tokens[index] if 0 <= index < len(tokens) else None

    fast: PreTrainedTokenizerBase = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, bos_token=special("bos_token_id"), eos_token=special("eos_token_id")
    )
    return fast
