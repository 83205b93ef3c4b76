"""The model: which checkpoint, which architecture, dtype and context length. `load_model_config`
reads config.json (or a GGUF file's metadata) and resolves the defaults; ModelConfig checks itself."""

import json
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from pagedserve.config.multimodal import (
    MultiModalConfig,
    bidirectional_image_tokens,
    image_token_id,
    placeholder_token_id,
    text_config,
)
from pagedserve.config.pooling import (
    ENCODER_MODEL_TYPES,
    POOLING_ONLY_ARCHITECTURES,
    PoolingModelConfig,
    encoder_position_offset,
    resolve_pooling,
    resolve_runner,
)
from pagedserve.errors import ConfigError
from pagedserve.families import (
    CONFIG_ALIASES,
    DECODERS,
    IMAGE_ARCHITECTURES,
    MLA_ARCHITECTURES,
    decoder_family,
)
from pagedserve.logger import init_logger
from pagedserve.utils.default_model import DEFAULT_MODEL_NAME, default_model_path
from pagedserve.utils.gguf_cache import gguf_hf_folder
from pagedserve.utils.gguf_mmproj import mmproj_hf_folder
from pagedserve.utils.hf_config import deepseek_unsupported, gpt_oss_config_problem
from pagedserve.utils.hf_tokenizer import tokenizer_source

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = init_logger(__name__)

DType = Literal["auto", "float32", "float16", "bfloat16"]
SUPPORTED_DTYPES: tuple[str, ...] = get_args(DType)
LoadFormat = Literal["auto", "dummy"]  # auto: read the checkpoint; dummy: random weights
# model_type -> architecture: every supported decoder family (pagedserve/families.py).
MODEL_ARCHITECTURES = {family.model_type: family.architecture for family in DECODERS}
# The dense families whose checkpoints keep q/k/v and gate/up as separate projections: 4-bit checkpoints
# load into their layers as they are, and LoRA adapters target their projections.
SEPARATE_PROJECTION_ARCHITECTURES = tuple(f.architecture for f in DECODERS if f.separate_projections)


@dataclass(frozen=True)
class ModelConfig:
    """A resolved, validated model setting. Raises ConfigError naming the flag to change."""

    model: str  # folder, GGUF file or hub id
    gguf_file: str | None  # set when loading from a GGUF file
    hf_config: "PretrainedConfig"  # the language model's (a multimodal checkpoint's text_config)
    architecture: str
    dtype: str  # resolved: float32 | float16 | bfloat16
    max_model_len: int
    served_model_name: str
    seed: int
    load_format: LoadFormat
    tokenizer: str | None
    max_logprobs: int
    quantization: str | None = (
        None  # resolved (config/quantization.py): gguf | int8 | int4, None: unquantized
    )
    served_model_aliases: tuple[str, ...] = ()  # --served-model-name's names after the first
    # SamplingParams field -> the model's default (generation_config.json; --generation-config).
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    # --runner pooling (config/pooling.py): embeddings or scores instead of generation; None: generate.
    pooling: PoolingModelConfig | None = None
    # --batch-invariant: the layers' kernels sum in an order that does not depend on the step's other rows.
    batch_invariant: bool = True
    # --cpu-offload-gb: GiB of decoder-layer weights kept in host memory, streamed to the device per step.
    cpu_offload_gb: float = 0.0
    # --linear-backend resolved (config/quantization.py): native | triton | torch.
    linear_backend: str = "native"
    # An image-taking checkpoint (config/multimodal.py): its whole config and the image bounds; None: text.
    multimodal: MultiModalConfig | None = None
    # --mmproj: llama.cpp's vision tower and projector GGUF beside a text GGUF (utils/gguf_mmproj.py)
    mmproj_file: str | None = None

    @property
    def processor_folder(self) -> str:
        """The folder whose processor files the image processor reads."""
        if self.gguf_file is not None and self.mmproj_file is not None:
            return mmproj_hf_folder(self.gguf_file, self.mmproj_file)
        return self.model

    def __post_init__(self) -> None:
        supported = set(MODEL_ARCHITECTURES.values()) | set(POOLING_ONLY_ARCHITECTURES)
        if self.architecture not in supported:
            raise ConfigError(
                f"Model architecture {self.architecture!r} is not supported. Supported "
                f"architectures: {', '.join(sorted(supported))}."
            )
        if self.architecture in MLA_ARCHITECTURES and (
            why := deepseek_unsupported(self.hf_config, self.architecture)
        ):
            raise ConfigError(f"The model's config.json asks for {why}: not implemented, refused.")
        if self.dtype not in SUPPORTED_DTYPES[1:]:
            raise ConfigError(
                f"dtype={self.dtype!r} is not supported; --dtype must be one of "
                f"{', '.join(SUPPORTED_DTYPES)}."
            )
        if self.load_format not in get_args(LoadFormat):
            raise ConfigError(
                f"load_format={self.load_format!r} is not supported; --load-format must be "
                f"one of {', '.join(get_args(LoadFormat))}."
            )
        if self.max_model_len < 1:
            raise ConfigError(f"max_model_len={self.max_model_len} must be at least 1 (--max-model-len).")
        limit, key = model_len_limit(self.hf_config)
        if self.max_model_len > limit:
            raise ConfigError(
                f"max_model_len={self.max_model_len} is larger than the model's "
                f"{key}={limit} (config.json); lower --max-model-len."
            )
        if self.max_logprobs < 0:
            raise ConfigError(f"max_logprobs={self.max_logprobs} must not be negative (--max-logprobs).")
        sinks = self.architecture in MODEL_ARCHITECTURES.values() and decoder_family(self.architecture).sinks
        if sinks and (problem := gpt_oss_config_problem(self.hf_config)):
            raise ConfigError(f"{self.model}: config.json's {problem} is not supported (--model).")
        if not math.isfinite(self.cpu_offload_gb) or self.cpu_offload_gb < 0:
            raise ConfigError(
                f"cpu_offload_gb={self.cpu_offload_gb} must be a finite number of GiB, 0 or more (--cpu-offload-gb)."
            )

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """Every name the API accepts for the model; the first is the one responses report."""
        return (self.served_model_name, *self.served_model_aliases)

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)


def model_len_limit(hf_config: "PretrainedConfig") -> tuple[int, str]:
    """The longest context the model supports, and the config.json key it comes from. Sliding-window
    layers attend through their window at any length, so the positions are the limit."""
    # NOTE: RoBERTa's first positions are its padding's: 514 positions hold 512 tokens.
    limit = int(hf_config.max_position_embeddings) - encoder_position_offset(hf_config)
    return limit, "max_position_embeddings"


def _multimodal_config(checkpoint_config: "PretrainedConfig") -> MultiModalConfig | None:
    """An image family's image settings (its config's tokens), None for a text model."""
    if checkpoint_config.model_type not in IMAGE_ARCHITECTURES:
        return None
    return MultiModalConfig(
        checkpoint_config,
        image_token_id(checkpoint_config),
        bidirectional_image_tokens(checkpoint_config),
        placeholder_token_id(checkpoint_config),
    )


def _served_names(served_model_name: str | list[str] | None, model: str | None) -> list[str]:
    """--served-model-name's names (the first is the model's, the rest aliases); the model's path without."""
    names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name or [])
    if not all(names):
        raise ConfigError(
            f"served_model_name={served_model_name!r}: a name must not be empty (--served-model-name)."
        )
    return names or [DEFAULT_MODEL_NAME if model is None else model]


def load_model_config(
    model: str | None,
    *,
    dtype: str,
    device: str,
    max_model_len: int | None,
    served_model_name: str | list[str] | None,
    seed: int,
    load_format: LoadFormat,
    tokenizer: str | None,
    max_logprobs: int,
    hf_config_path: str | None = None,
    runner: str = "auto",
    convert: str = "auto",
    pooler_config: str | None = None,
    mmproj: str | None = None,
) -> ModelConfig:
    """Read the model's config (the embedded default model when `model` is None; `hf_config_path`'s
    config.json when given) and resolve the defaults: architecture, dtype for `device`, context length,
    served name."""
    path = model
    if path is None:
        path = default_model_path()
        logger.info("No model given: using the embedded default %s (%s).", DEFAULT_MODEL_NAME, path)
    checkpoint_config, gguf_file = _load_hf_config(path, hf_config_path, mmproj)
    archs = getattr(checkpoint_config, "architectures", None) or [
        MODEL_ARCHITECTURES.get(checkpoint_config.model_type)
        or ENCODER_MODEL_TYPES.get(checkpoint_config.model_type, checkpoint_config.model_type)
    ]
    multimodal = _multimodal_config(checkpoint_config)
    # NOTE: sizing, the KV layout and the LM read the language model's config alone.
    hf_config = text_config(checkpoint_config)
    limit, _ = model_len_limit(hf_config)
    names = _served_names(served_model_name, model)
    pooling = _pooling(path, hf_config, archs[0], runner, convert, pooler_config, tokenizer, gguf_file)
    return ModelConfig(
        model=path,
        gguf_file=gguf_file,
        hf_config=hf_config,
        architecture=archs[0],
        dtype=_resolve_dtype(dtype, hf_config, device),
        max_model_len=max_model_len or limit,
        served_model_name=names[0],
        served_model_aliases=tuple(names[1:]),
        seed=seed,
        load_format=load_format,
        tokenizer=tokenizer,
        max_logprobs=max_logprobs,
        pooling=pooling,
        multimodal=multimodal,
        mmproj_file=mmproj,
    )


def _pooling(
    path: str,
    hf_config: "PretrainedConfig",
    architecture: str,
    runner: str,
    convert: str,
    pooler_config: str | None,
    tokenizer: str | None,
    gguf_file: str | None,
) -> PoolingModelConfig | None:
    """The pooling runner's settings when the model runs on it (--runner), else None."""
    if not resolve_runner(runner, architecture):
        return None
    source = tokenizer_source(path, tokenizer, gguf_file)
    return resolve_pooling(path, hf_config, architecture, convert, pooler_config, source)


def _resolve_dtype(dtype: str, hf_config: "PretrainedConfig", device: str) -> str:
    if dtype not in SUPPORTED_DTYPES:
        raise ConfigError(
            f"dtype={dtype!r} is not supported; --dtype must be one of {', '.join(SUPPORTED_DTYPES)}."
        )
    if dtype != "auto":
        return dtype
    if device == "cpu":
        return "float32"
    checkpoint = str(getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or "")
    checkpoint = checkpoint.replace("torch.", "")
    return checkpoint if checkpoint in ("float16", "bfloat16") else "bfloat16"


def _aliased_config(folder: str) -> "PretrainedConfig | None":
    """A config.json whose `model_type` is built on a family (`FamilyFacts.config_aliases`: its own config
    class is remote code, which pagedserve never runs) read with that family's config class; else None."""
    from transformers import AutoConfig

    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return None  # AutoConfig says what is missing
    with open(path, encoding="utf-8") as file:
        fields = json.load(file)
    model_type = fields.get("model_type") if isinstance(fields, dict) else None
    target = CONFIG_ALIASES.get(model_type) if isinstance(model_type, str) else None
    if target is None:
        return None
    fields = {key: value for key, value in fields.items() if key not in ("model_type", "auto_map")}
    return AutoConfig.for_model(target, **fields)


def _load_hf_config(
    model: str, hf_config_path: str | None, mmproj: str | None
) -> tuple["PretrainedConfig", str | None]:
    """config.json of a folder (or of `hf_config_path`), or the metadata of a GGUF file (with `mmproj`'s:
    the image model's); hub ids are local paths by now (utils/hub.py)."""
    from transformers import AutoConfig  # NOTE: lazy: core/ imports config, and must stay light

    gguf_file = None
    if model.endswith(".gguf"):
        if not os.path.isfile(model):
            raise ConfigError(f"GGUF file {model} does not exist (--model).")
        gguf_file = model
    elif os.path.isdir(model) and not os.path.isfile(os.path.join(model, "config.json")):
        ggufs = sorted(f for f in os.listdir(model) if f.endswith(".gguf"))
        if not ggufs:
            raise ConfigError(f"Model folder {model} has neither config.json nor a .gguf file (--model).")
        gguf_file = os.path.join(model, ggufs[0])
    if mmproj is not None and gguf_file is None:
        raise ConfigError(f"--mmproj adds images to a GGUF --model; {model} is not a GGUF file.")
    gguf_folder = gguf_file and (
        mmproj_hf_folder(gguf_file, mmproj) if mmproj is not None else gguf_hf_folder(gguf_file)
    )
    source = hf_config_path or gguf_folder or model
    try:
        aliased = None if gguf_file else _aliased_config(source)
        return aliased or AutoConfig.from_pretrained(source), gguf_file
    except (OSError, ValueError) as exc:  # ValueError: a folder without a usable config.json
        flag = "--hf-config-path" if hf_config_path else "--model"
        raise ConfigError(f"Cannot load the model config of {source!r} ({flag}): {exc}") from exc
