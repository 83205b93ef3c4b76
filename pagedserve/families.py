"""The model families pagedserve runs, one entry each: the facts about a family that more than one part of
the engine needs (sizing, the planner, the HF and GGUF config readers, the GGUF loader, the registry),
written once here, as plain data (no torch), so that every part imports them instead of restating them.
A family's math lives in models/<module>.py; adding a family touches that file, its entry here and its
tests. tests/models/test_family_table.py fails if an architecture name appears anywhere else."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from pagedserve.errors import ConfigError

# Where the norms of a decoder layer sit: "pre": one before attention and one before the MLP (Llama);
# "sandwich": also one after each (Gemma 2/3); "parallel": attention and MLP off the same input, one or
# two LayerNorms as the config says (Falcon).
NormPlacement = Literal["pre", "sandwich", "parallel"]
# Which layers `sliding_window` applies to: "layer_types": the "sliding_attention" entries of the
# config's `layer_types` when it lists them, else every layer; "every_layer": every layer, whatever
# `layer_types` says (HF's Mistral, Mixtral, Phi-3 and Qwen3-MoE code ignores it).
WindowRule = Literal["layer_types", "every_layer"]
# How a family's KV heads are counted: "num_key_value_heads" (default the heads), or "multi_query"
# (Falcon's): grouped with the new decoder architecture, one for multi-query, else one per head.
KVHeadsRule = Literal["num_key_value_heads", "multi_query"]


def _frozen(names: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(names or {}))


@dataclass(frozen=True)
class MoELayout:
    """A mixture-of-experts family's layout."""

    checkpoint_module: str  # where HF's checkpoint keeps a layer's router and experts
    # every layer is sparse (Mixtral); else every `decoder_sparse_step`-th layer but `mlp_only_layers`
    every_layer: bool
    expert_size_field: str  # the config field with one expert's intermediate size
    shared_expert: bool  # a gated shared expert beside the routed ones (its size in the config)


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention (one latent per token in the KV cache) and its expert routing
    (models/deepseek_v2.py): the `scoring_func` and `topk_method` values it implements (None: unset)."""

    scoring_funcs: tuple[str | None, ...]
    topk_methods: tuple[str | None, ...]
    correction_bias: bool  # V3's e_score_correction_bias (noaux_tc): one more value per expert


@dataclass(frozen=True)
class MmprojFacts:
    """The images llama.cpp ships beside a family's text GGUF: an mmproj GGUF (`clip.projector_type`
    `projector_type`) holding the vision tower and projector, of kind `tower` (how its config and tensors
    are read: utils/gguf_mmproj.py, model_loader/gguf_mmproj.py); the two make a `model_type` checkpoint."""

    projector_type: str
    model_type: str
    tower: Literal["siglip", "qwen_vit"]


@dataclass(frozen=True)
class GGUFFacts:
    """How llama.cpp's converter writes a family (general.architecture `architecture`) and what the
    loader undoes to get HF's tensors back."""

    architecture: str  # general.architecture
    holds: str  # the families such a file can be (for the error naming the supported ones)
    layer_prefix: str = "model.layers"  # HF's name of decoder layer N is `<layer_prefix>.N`
    common_layer_names: bool = True  # start from llama.cpp's usual block names (model_loader/gguf.py)
    layer_names: Mapping[str, str] = field(default_factory=_frozen)  # block names that differ or add
    global_names: Mapping[str, str] | None = None  # the tensors outside the layers; None: Llama's
    new_decoder_layer_names: Mapping[str, str] = field(default_factory=_frozen)  # Falcon 40B/180B's
    permuted_qk: bool = False  # q/k rows permuted for llama.cpp's rope layout
    norm_plus_one: bool = False  # norm weights stored as 1 + w (Gemma's RMSNorm)
    # The query scale's `query_pre_attn_scalar`, which transformers' GGUF reading leaves at the config
    # class's 256: the head size, but hidden / heads for a model of this many layers (Gemma 3 27B, as
    # Google's configs and llama.cpp have it)
    query_scalar_hidden_per_head_layers: int | None = None
    grouped_fused_qkv: bool = False  # fused q/k/v stored as [q; k; v], HF groups it per KV head (Falcon)
    expert_sizes_in_metadata: bool = False  # the experts' sizes only in llama.cpp's keys (Qwen-MoE)
    sparse_architecture: str | None = None  # what a file with `<arch>.expert_count` > 0 is (Mixtral)
    # transformers cannot read the file: its config and BPE tokenizer come from llama.cpp's keys
    # (utils/gguf_metadata_config.py)
    config_from_metadata: bool = False
    bare_tensors: tuple[str, ...] = ()  # blocks whose HF tensor is a bare parameter (no `.weight`)
    # HF fuses the experts' gate and up, interleaved by rows, which llama.cpp splits (gpt-oss); joined
    # back at load (model_loader/gguf_gate_up.py)
    joined_gate_up: bool = False
    # MLA's kv_b_proj stored as k_b (transposed) and v_b per head (DeepSeek), joined back at load
    # (model_loader/gguf_latent.py)
    split_latent_kv: bool = False
    # --mmproj adds images (None: the flag is refused)
    mmproj: MmprojFacts | None = None
    # transformers reads the file's vocabulary as SentencePiece only (Gemma): a byte-level BPE one
    # (`tokenizer.ggml.model` gpt2) is read here (utils/gguf_metadata_config.py)
    sentencepiece_only: bool = False


@dataclass(frozen=True)
class FamilyFacts:
    """One family: its names in HF configs and GGUF files, and the facts the engine reads about it."""

    module: str  # models/<module>.py defines the classes
    model_type: str  # config.json's `model_type`
    architecture: str  # config.json's `architectures` entry, and our class's name in `module`
    classifier: str | None = None  # its *ForSequenceClassification architecture, if served
    encoder: bool = False  # bidirectional: the pooling runner only, no KV cache
    positions_after_padding: bool = False  # an encoder's position ids start at pad_token_id + 1 (RoBERTa)
    qkv_bias: bool = False  # a bias on the q/k/v projections (Qwen2, Qwen2-MoE)
    bias_field: str | None = None  # a config field that turns every linear's bias on (Falcon's `bias`)
    qk_norm: bool = False  # a norm over each head of q and k before rotary (the model picks its kind)
    norm_placement: NormPlacement = "pre"
    layer_norm: bool = False  # LayerNorms with a bias instead of RMSNorms
    gated_mlp: bool = True  # gate, up and down (else up and down)
    mlp_size_field: str = "intermediate_size"  # the config field with the dense MLP's size
    fused_projections: bool = False  # the checkpoint fuses q/k/v and gate/up (Phi-3, Falcon)
    window_rule: WindowRule = "layer_types"
    kv_heads_rule: KVHeadsRule = "num_key_value_heads"
    moe: MoELayout | None = None
    gguf: GGUFFacts | None = None  # None: no GGUF of its own (see `holds` of the one that carries it)
    # other `model_type`s of configs built on this family whose own config class is remote code (Kimi-K2's
    # `kimi_k2` on DeepSeek V3): read with this family's config class
    config_aliases: tuple[str, ...] = ()
    takes_images: bool = False  # a vision encoder feeds the language model (config/multimodal.py)
    lora_on_language_model: bool = False  # an image family whose LoRA adapters go on its language model
    # Qwen2-VL's M-RoPE over dynamic-resolution images: each image's grid (the image processor's
    # image_grid_thw) sets its tokens and their 3-D positions (worker/mrope_positions.py)
    mrope: bool = False
    # the placeholder tokens of one image attend each other both ways during prefill (Gemma 3), so a
    # prefill chunk never ends inside an image; `mm_tokens_per_image` of its config gives their number
    bidirectional_images: bool = False
    # gpt-oss's: attention sinks (a logit per head in the softmax); its config is checked by
    # utils/hf_config.gpt_oss_config_problem
    sinks: bool = False
    output_and_expert_biases: bool = False  # biases on o_proj, the router and every expert (gpt-oss)
    harmony_chat: bool = False  # chats in OpenAI's harmony format (entrypoints/openai/harmony_prompt.py)
    mxfp4_experts: bool = False  # its fused experts layer takes MXFP4 checkpoints (quantization/mxfp4.py)
    mla: LatentAttention | None = None

    @property
    def separate_projections(self) -> bool:
        """A dense family whose checkpoint keeps q/k/v and gate/up apart: 4-bit checkpoints load into its
        layers as they are, and LoRA adapters target its projections."""
        return self.joined_projections is None

    @property
    def joined_projections(self) -> str | None:
        """Why its layers are not the separate projections adapters and 4-bit checkpoints target."""
        reasons = (
            (self.encoder, "an encoder"),
            (self.fused_projections, "its checkpoint fuses q/k/v and gate/up"),
            (self.takes_images, "a vision encoder feeds it"),
            (self.moe is not None, "its MLPs are fused experts"),
            (self.mla is not None, "its q/k/v come from latent projections (MLA)"),
        )
        return next((why for joined, why in reasons if joined), None)


_GEMMA_GGUF_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_BERT_GGUF = GGUFFacts(
    "bert",
    "BERT embedding models, --runner pooling",
    layer_prefix="encoder.layer",
    common_layer_names=False,
    layer_names=_frozen(
        {
            "attn_q": "attention.self.query",
            "attn_k": "attention.self.key",
            "attn_v": "attention.self.value",
            "attn_output": "attention.output.dense",
            "attn_output_norm": "attention.output.LayerNorm",
            "ffn_up": "intermediate.dense",
            "ffn_down": "output.dense",
            "layer_output_norm": "output.LayerNorm",
        }
    ),
    # its reranker head, `cls`, is not read
    global_names=_frozen(
        {
            "token_embd": "embeddings.word_embeddings",
            "token_types": "embeddings.token_type_embeddings",
            "position_embd": "embeddings.position_embeddings",
            "token_embd_norm": "embeddings.LayerNorm",
        }
    ),
)

FAMILIES: tuple[FamilyFacts, ...] = (
    FamilyFacts(
        "llama",
        "llama",
        "LlamaForCausalLM",
        classifier="LlamaForSequenceClassification",
        gguf=GGUFFacts(
            "llama",
            "Llama, Mistral, Mixtral (with llama.expert_count)",
            permuted_qk=True,
            sparse_architecture="MixtralForCausalLM",
        ),
    ),
    FamilyFacts("mistral", "mistral", "MistralForCausalLM", window_rule="every_layer"),
    FamilyFacts(
        "qwen2",
        "qwen2",
        "Qwen2ForCausalLM",
        classifier="Qwen2ForSequenceClassification",
        qkv_bias=True,
        gguf=GGUFFacts("qwen2", "Qwen2"),
    ),
    FamilyFacts(
        "qwen3",
        "qwen3",
        "Qwen3ForCausalLM",
        classifier="Qwen3ForSequenceClassification",
        qk_norm=True,
        gguf=GGUFFacts("qwen3", "Qwen3"),
    ),
    FamilyFacts(
        "gemma2",
        "gemma2",
        "Gemma2ForCausalLM",
        norm_placement="sandwich",
        gguf=GGUFFacts("gemma2", "Gemma 2", layer_names=_frozen(_GEMMA_GGUF_NAMES), norm_plus_one=True),
    ),
    FamilyFacts(
        "gemma3_text",
        "gemma3_text",
        "Gemma3ForCausalLM",
        qk_norm=True,
        norm_placement="sandwich",
        gguf=GGUFFacts(
            "gemma3",
            "Gemma 3 (images with --mmproj)",
            layer_names=_frozen(_GEMMA_GGUF_NAMES),
            norm_plus_one=True,
            query_scalar_hidden_per_head_layers=62,
            mmproj=MmprojFacts("gemma3", "gemma3", "siglip"),
            sentencepiece_only=True,
        ),
    ),
    FamilyFacts(
        "phi3",
        "phi3",
        "Phi3ForCausalLM",
        fused_projections=True,
        window_rule="every_layer",
        # gate and up fused, as in HF's checkpoint
        gguf=GGUFFacts("phi3", "Phi-3", layer_names=_frozen({"ffn_up": "mlp.gate_up_proj"})),
    ),
    FamilyFacts(
        "falcon",
        "falcon",
        "FalconForCausalLM",
        bias_field="bias",
        norm_placement="parallel",
        layer_norm=True,
        gated_mlp=False,
        mlp_size_field="ffn_hidden_size",  # default 4 x hidden_size
        fused_projections=True,
        kv_heads_rule="multi_query",
        gguf=GGUFFacts(
            "falcon",
            "Falcon",
            layer_prefix="transformer.h",
            layer_names=_frozen(
                {
                    "attn_norm_2": "ln_mlp",
                    "attn_qkv": "self_attention.query_key_value",
                    "attn_output": "self_attention.dense",
                    "ffn_up": "mlp.dense_h_to_4h",
                    "ffn_down": "mlp.dense_4h_to_h",
                }
            ),
            global_names=_frozen(
                {
                    "token_embd": "transformer.word_embeddings",
                    "output_norm": "transformer.ln_f",
                    "output": "lm_head",
                }
            ),
            new_decoder_layer_names=_frozen({"attn_norm": "ln_attn"}),
            grouped_fused_qkv=True,
        ),
    ),
    FamilyFacts(
        "mixtral",
        "mixtral",
        "MixtralForCausalLM",
        window_rule="every_layer",
        moe=MoELayout(
            "block_sparse_moe", every_layer=True, expert_size_field="intermediate_size", shared_expert=False
        ),
    ),
    FamilyFacts(
        "qwen2_moe",
        "qwen2_moe",
        "Qwen2MoeForCausalLM",
        qkv_bias=True,
        moe=MoELayout(
            "mlp", every_layer=False, expert_size_field="moe_intermediate_size", shared_expert=True
        ),
        gguf=GGUFFacts("qwen2moe", "Qwen2-MoE", expert_sizes_in_metadata=True),
    ),
    FamilyFacts(
        "qwen3_moe",
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        qk_norm=True,
        window_rule="every_layer",
        moe=MoELayout(
            "mlp", every_layer=False, expert_size_field="moe_intermediate_size", shared_expert=False
        ),
        gguf=GGUFFacts("qwen3moe", "Qwen3-MoE", expert_sizes_in_metadata=True),
    ),
    FamilyFacts(
        "gpt_oss",
        "gpt_oss",
        "GptOssForCausalLM",
        qkv_bias=True,
        moe=MoELayout("mlp", every_layer=True, expert_size_field="intermediate_size", shared_expert=False),
        sinks=True,
        output_and_expert_biases=True,
        harmony_chat=True,
        mxfp4_experts=True,
        gguf=GGUFFacts(
            "gpt-oss",
            "gpt-oss (experts in MXFP4 or float)",
            layer_names=_frozen(
                {
                    "post_attention_norm": "post_attention_layernorm",
                    "attn_sinks": "self_attn.sinks",
                    "ffn_gate_inp": "mlp.router",
                }
            ),
            config_from_metadata=True,
            bare_tensors=("attn_sinks",),
            joined_gate_up=True,
        ),
    ),
    FamilyFacts(
        "deepseek_v2",
        "deepseek_v2",
        "DeepseekV2ForCausalLM",
        mla=LatentAttention(
            (None, "softmax"), (None, "greedy", "group_limited_greedy"), correction_bias=False
        ),
        # V2 and V3 alike: the config reader picks the family by the experts' scoring (sigmoid: V3)
        gguf=GGUFFacts(
            "deepseek2",
            "DeepSeek V2/V3",
            layer_names=_frozen(
                {
                    "attn_q_a": "self_attn.q_a_proj",
                    "attn_q_a_norm": "self_attn.q_a_layernorm",
                    "attn_q_b": "self_attn.q_b_proj",
                    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
                    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
                    "attn_k_b": "self_attn.k_b_proj",
                    "attn_v_b": "self_attn.v_b_proj",
                    "exp_probs_b": "mlp.gate.e_score_correction_bias",
                    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
                    "ffn_up_shexp": "mlp.shared_experts.up_proj",
                    "ffn_down_shexp": "mlp.shared_experts.down_proj",
                }
            ),
            config_from_metadata=True,
            bare_tensors=("exp_probs_b",),
            split_latent_kv=True,
        ),
    ),
    FamilyFacts(
        "deepseek_v2",
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        mla=LatentAttention((None, "sigmoid"), (None, "noaux_tc"), correction_bias=True),
        config_aliases=("kimi_k2",),
    ),
    FamilyFacts(
        "llava", "llava", "LlavaForConditionalGeneration", takes_images=True, lora_on_language_model=True
    ),
    FamilyFacts(
        "llava_next",
        "llava_next",
        "LlavaNextForConditionalGeneration",
        takes_images=True,
        lora_on_language_model=True,
    ),
    FamilyFacts(
        "qwen2_5_vl",
        "qwen2_5_vl",
        "Qwen2_5_VLForConditionalGeneration",
        qkv_bias=True,
        takes_images=True,
        mrope=True,
        # NOTE: the text GGUF alone is its language model: a Qwen2 whose M-RoPE, without images, is RoPE
        gguf=GGUFFacts(
            "qwen2vl",
            "Qwen2.5-VL (images with --mmproj)",
            config_from_metadata=True,
            mmproj=MmprojFacts("qwen2.5vl_merger", "qwen2_5_vl", "qwen_vit"),
        ),
    ),
    FamilyFacts(
        "gemma3_mm",
        "gemma3",
        "Gemma3ForConditionalGeneration",
        qk_norm=True,
        norm_placement="sandwich",
        takes_images=True,
        bidirectional_images=True,
    ),
    FamilyFacts(
        "bert", "bert", "BertModel", classifier="BertForSequenceClassification", encoder=True, gguf=_BERT_GGUF
    ),
    FamilyFacts(
        "bert",
        "roberta",
        "RobertaModel",
        classifier="RobertaForSequenceClassification",
        encoder=True,
        positions_after_padding=True,
    ),
    FamilyFacts(
        "bert",
        "xlm-roberta",
        "XLMRobertaModel",
        classifier="XLMRobertaForSequenceClassification",
        encoder=True,
        positions_after_padding=True,
    ),
)

DECODERS = tuple(family for family in FAMILIES if not family.encoder)
ENCODERS = tuple(family for family in FAMILIES if family.encoder)
MLA_ARCHITECTURES = frozenset(family.architecture for family in FAMILIES if family.mla is not None)
MXFP4_ARCHITECTURES = tuple(family.architecture for family in FAMILIES if family.mxfp4_experts)
# model_type -> architecture of the families that take images.
IMAGE_ARCHITECTURES: Mapping[str, str] = MappingProxyType(
    {family.model_type: family.architecture for family in FAMILIES if family.takes_images}
)
# model_type of a config built on a family (its own config class remote code) -> the family's model_type.
CONFIG_ALIASES: Mapping[str, str] = MappingProxyType(
    {alias: family.model_type for family in FAMILIES for alias in family.config_aliases}
)
# clip.projector_type -> the kind of vision tower its mmproj GGUF holds (--mmproj).
MMPROJ_TOWERS: Mapping[str, str] = MappingProxyType(
    {
        family.gguf.mmproj.projector_type: family.gguf.mmproj.tower
        for family in FAMILIES
        if family.gguf is not None and family.gguf.mmproj is not None
    }
)
_BY_ARCHITECTURE = {family.architecture: family for family in FAMILIES}
_BY_GGUF = {family.gguf.architecture: family for family in FAMILIES if family.gguf is not None}
# general.architecture -> how llama.cpp writes it, for every GGUF architecture pagedserve loads.
GGUF_ARCHITECTURES: Mapping[str, GGUFFacts] = MappingProxyType(
    {family.gguf.architecture: family.gguf for family in FAMILIES if family.gguf is not None}
)


def family(architecture: str) -> FamilyFacts | None:
    """The family whose HF architecture (or its classifier's) is `architecture`; None if unsupported."""
    found = _BY_ARCHITECTURE.get(architecture)
    if found is not None:
        return found
    return next((f for f in FAMILIES if f.classifier == architecture), None)


def decoder_family(architecture: str) -> FamilyFacts:
    """The decoder family of `architecture`. Raises ConfigError for an encoder or an unknown name."""
    found = family(architecture)
    if found is None or found.encoder:
        raise ConfigError(
            f"Model architecture {architecture!r} is not a decoder pagedserve sizes; decoder architectures: "
            f"{', '.join(f.architecture for f in DECODERS)} (--model)."
        )
    return found


def gguf_family(architecture: str) -> FamilyFacts | None:
    """The family of GGUF general.architecture `architecture` (its `gguf` set); None if not loaded."""
    return _BY_GGUF.get(architecture)
