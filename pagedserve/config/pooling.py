"""The pooling runner's model settings (--runner pooling, --convert, --pooler-config): what a forward's
hidden states become, read from the model's own sentence-transformers files (modules.json,
1_Pooling/config.json, 2_Normalize, config_sentence_transformers.json) or a GGUF's pooling type, and
overridable as in vLLM."""

import json
import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, get_args

from pagedserve.errors import ConfigError
from pagedserve.families import DECODERS, ENCODERS
from pagedserve.utils.hf_tokenizer import load_hf_tokenizer

if TYPE_CHECKING:
    from transformers import PretrainedConfig

PoolingType = Literal["MEAN", "CLS", "LAST"]
POOLING_TYPES: tuple[str, ...] = get_args(PoolingType)
PoolingTask = Literal["embed", "classify"]
RunnerName = Literal["auto", "generate", "pooling"]
ConvertName = Literal["auto", "embed", "classify"]

# Bidirectional encoders: they run on the pooling runner only, with no KV cache.
ENCODER_ARCHITECTURES = {
    **{family.architecture: "embed" for family in ENCODERS},
    **{family.classifier: "classify" for family in ENCODERS if family.classifier},
}
# Decoders with HF's sequence-classification head (a `score` linear, no bias, at each prompt's last token):
# causal attention, pooling runner only (no LM head to generate with).
DECODER_CLASSIFIER_ARCHITECTURES = tuple(family.classifier for family in DECODERS if family.classifier)
# Every architecture that only pools -> its task under --convert auto.
POOLING_ONLY_ARCHITECTURES: dict[str, str] = {
    **ENCODER_ARCHITECTURES,
    **dict.fromkeys(DECODER_CLASSIFIER_ARCHITECTURES, "classify"),
}
# config.json without `architectures`: the encoder its model_type means.
ENCODER_MODEL_TYPES = {family.model_type: family.architecture for family in ENCODERS}
# sentence-transformers' 1_Pooling/config.json flags -> our pooling type.
_ST_POOLING_MODES = {
    "pooling_mode_cls_token": "CLS",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_lasttoken": "LAST",
}


@dataclass(frozen=True)
class PoolerConfig:
    """How hidden states are pooled: `pooling_type` over each prompt's tokens; `normalize`: L2 of an
    embedding (sentence-transformers' Normalize module); `activation`: softmax (sigmoid for one label)
    over a classifier's logits."""

    pooling_type: PoolingType
    normalize: bool = True
    activation: bool = True
    # A decoder as a cross-encoder (Qwen3-Reranker, vLLM's name): its LM head's logits of these tokens at
    # the last position; two ("no", "yes"): the score is sigmoid(yes - no), one: sigmoid of its logit.
    classifier_from_token: tuple[str, ...] = ()


@dataclass(frozen=True)
class PoolingModelConfig:
    """A model served by the pooling runner. `hidden_size`: an embedding's full length;
    `matryoshka_dimensions`: None when the model declares no Matryoshka training (`dimensions` is then
    refused), () when any length works; `prompts`: sentence-transformers' named prompt prefixes."""

    task: PoolingTask
    pooler: PoolerConfig
    is_encoder: bool
    hidden_size: int
    num_labels: int = 0
    matryoshka_dimensions: tuple[int, ...] | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    classifier_token_ids: tuple[int, ...] = ()  # the pooler's classifier_from_token, as token ids


def resolve_runner(runner: str, architecture: str) -> bool:
    """Whether the model runs on the pooling runner (auto: encoders and classifiers do, decoders
    generate)."""
    if runner not in get_args(RunnerName):
        raise ConfigError(f"runner={runner!r}: --runner must be one of {', '.join(get_args(RunnerName))}.")
    if architecture in POOLING_ONLY_ARCHITECTURES and runner == "generate":
        kind = "an encoder" if architecture in ENCODER_ARCHITECTURES else "a classifier (no LM head)"
        raise ConfigError(f"{architecture} is {kind}: it cannot generate. Use --runner pooling (or auto).")
    return runner == "pooling" or architecture in POOLING_ONLY_ARCHITECTURES


def resolve_pooling(
    model_path: str,
    hf_config: "PretrainedConfig",
    architecture: str,
    convert: str,
    pooler_json: str | None,
    tokenizer_source: str = "",
) -> PoolingModelConfig:
    """The model's pooling settings: --convert's task (auto: classify for *ForSequenceClassification,
    else embed), the sentence-transformers files' pooling (else a GGUF's), --pooler-config over them."""
    if convert not in get_args(ConvertName):
        raise ConfigError(
            f"convert={convert!r}: --convert must be one of {', '.join(get_args(ConvertName))}."
        )
    is_encoder = architecture in ENCODER_ARCHITECTURES
    task = POOLING_ONLY_ARCHITECTURES.get(architecture, "embed") if convert == "auto" else convert
    folder = model_path if os.path.isdir(model_path) else ""
    pooler = (
        _sentence_transformers_pooler(folder)
        or _gguf_pooler(hf_config)
        or PoolerConfig("CLS" if is_encoder else "LAST")
    )
    if pooler_json:
        pooler = _override_pooler(pooler, pooler_json)
    if task == "classify" and not (
        architecture.endswith("ForSequenceClassification") or pooler.classifier_from_token
    ):
        raise ConfigError(
            f"--convert classify needs a classification head, and {architecture} has none; supported "
            f"cross-encoders: {', '.join(a for a, t in POOLING_ONLY_ARCHITECTURES.items() if t == 'classify')}, "
            'or a decoder reranker with --pooler-config \'{"classifier_from_token": ["no", "yes"]}\'.'
        )
    st = _read_json(folder, "config_sentence_transformers.json")
    prompts = st.get("prompts")
    default_prompt = st.get("default_prompt_name")
    dims = getattr(hf_config, "matryoshka_dimensions", None)
    matryoshka = (
        tuple(int(d) for d in dims) if dims else (() if getattr(hf_config, "is_matryoshka", False) else None)
    )
    return PoolingModelConfig(
        task="classify" if task == "classify" else "embed",
        pooler=pooler,
        is_encoder=is_encoder,
        hidden_size=int(hf_config.hidden_size),
        num_labels=(1 if pooler.classifier_from_token else int(getattr(hf_config, "num_labels", 0) or 0))
        if task == "classify"
        else 0,
        matryoshka_dimensions=matryoshka,
        prompts={str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {},
        default_prompt_name=default_prompt if isinstance(default_prompt, str) else None,
        classifier_token_ids=_token_ids(pooler.classifier_from_token, tokenizer_source or model_path)
        if task == "classify"
        else (),
    )


def _token_ids(tokens: tuple[str, ...], tokenizer_source: str) -> tuple[int, ...]:
    """Each token's id in the model's tokenizer (one token each, or the reranker would score another)."""
    if not tokens:
        return ()
    tokenizer = load_hf_tokenizer(tokenizer_source)
    ids = []
    for token in tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1:
            raise ConfigError(
                f"--pooler-config classifier_from_token {token!r} is {len(encoded)} tokens in the model's "
                "tokenizer; each must be exactly one."
            )
        ids.append(int(encoded[0]))
    return tuple(ids)


def _read_json(folder: str, name: str) -> dict[str, object]:
    path = os.path.join(folder, name)
    if not folder or not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _sentence_transformers_pooler(folder: str) -> PoolerConfig | None:
    """modules.json's Pooling module (its mode) and whether a Normalize module follows; None without one."""
    path = os.path.join(folder, "modules.json")
    if not folder or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        modules = json.load(f)
    types = {str(m.get("type", "")).rsplit(".", 1)[-1]: str(m.get("path", "")) for m in modules}
    if "Pooling" not in types:
        return None
    settings = _read_json(os.path.join(folder, types["Pooling"]), "config.json")
    modes = [ours for key, ours in _ST_POOLING_MODES.items() if settings.get(key)]
    if len(modes) != 1:
        raise ConfigError(
            f"{folder}'s pooling ({types['Pooling']}/config.json) is not one of CLS, mean or last token; "
            'set it with --pooler-config \'{"pooling_type": "MEAN"}\'.'
        )
    return PoolerConfig(modes[0], normalize="Normalize" in types)  # type: ignore[arg-type]


def _gguf_pooler(hf_config: "PretrainedConfig") -> PoolerConfig | None:
    """A GGUF's own pooling type (llama.cpp's `{arch}.pooling_type`, utils/gguf_config.py), normalized as
    llama.cpp's server returns embeddings; None when the file declares none."""
    kind = getattr(hf_config, "gguf_pooling_type", None)
    if kind is None:
        return None
    if kind not in POOLING_TYPES:
        raise ConfigError(
            f"The GGUF's pooling type is {kind} (a reranker's classification head), which pagedserve does "
            "not load from GGUF yet; serve the reranker's HF folder (--model)."
        )
    return PoolerConfig(kind)


def _override_pooler(pooler: PoolerConfig, text: str) -> PoolerConfig:
    """--pooler-config: JSON with pooling_type (MEAN, CLS, LAST), normalize, activation (vLLM's names)."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--pooler-config is not JSON: {exc}") from exc
    allowed = {"pooling_type", "normalize", "activation", "classifier_from_token"}
    if not isinstance(values, dict) or set(values) - allowed:
        raise ConfigError(f"--pooler-config must be a JSON object with keys among {sorted(allowed)}.")
    kind = str(values.get("pooling_type", pooler.pooling_type)).upper()
    if kind not in POOLING_TYPES:
        raise ConfigError(f"--pooler-config pooling_type {kind!r} must be one of {', '.join(POOLING_TYPES)}.")
    flags = {k: values[k] for k in ("normalize", "activation") if k in values}
    if any(not isinstance(v, bool) for v in flags.values()):
        raise ConfigError("--pooler-config normalize and activation must be true or false.")
    tokens = values.get("classifier_from_token", [])
    if not isinstance(tokens, list) or len(tokens) > 2 or not all(isinstance(t, str) and t for t in tokens):
        raise ConfigError(
            '--pooler-config classifier_from_token must be one or two tokens, e.g. ["no", "yes"].'
        )
    return replace(pooler, pooling_type=kind, classifier_from_token=tuple(tokens), **flags)  # type: ignore[arg-type]


def encoder_position_offset(hf_config: "PretrainedConfig") -> int:
    """RoBERTa's positions start after its padding index (HF's create_position_ids_from_input_ids)."""
    if any(f.positions_after_padding and f.model_type == hf_config.model_type for f in ENCODERS):
        return int(hf_config.pad_token_id) + 1
    return 0
