"""Speculative decoding settings (vLLM's `speculative_config`)."""

from dataclasses import dataclass, replace
from typing import Any

from pagedserve.config.model import ModelConfig, load_model_config
from pagedserve.errors import ConfigError
from pagedserve.utils.hub import resolve_model_path
from pagedserve.utils.user_json import load_user_json

_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True)
class SpeculativeConfig:
    """n-gram prompt lookup or a draft model proposes up to `num_speculative_tokens` drafts per step,
    verified in one forward of the model."""

    method: str  # ngram | draft_model
    num_speculative_tokens: int
    prompt_lookup_max: int = 5
    prompt_lookup_min: int = 5
    model: str | None = None  # the draft model (method draft_model)
    draft_model_config: ModelConfig | None = None  # resolved by resolve_speculative_config

    @classmethod
    def from_user(cls, value: dict[str, Any] | str) -> "SpeculativeConfig":
        """From a dict, or its JSON text (--speculative-config). Raises ConfigError naming the key."""
        value = load_user_json(value, ConfigError, "--speculative-config is not valid JSON")
        if not isinstance(value, dict):
            raise ConfigError(
                "speculative_config must be a JSON object, e.g. "
                '{"method": "ngram", "num_speculative_tokens": 4}.'
            )
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise ConfigError(
                f"Unknown speculative_config key(s): {', '.join(map(str, unknown))}; "
                f"supported: {', '.join(_KEYS)}."
            )
        method = value.get("method") or ("draft_model" if value.get("model") else None)
        if method not in ("ngram", "draft_model"):
            raise ConfigError(
                f'speculative_config method {method!r} is not supported; supported: "ngram" '
                '(prompt lookup) and "draft_model" (with "model": a folder, GGUF file or hub id).'
            )
        if (method == "draft_model") != isinstance(value.get("model"), str):
            raise ConfigError(
                'speculative_config needs "model" (a path) with method "draft_model", and only then.'
            )
        # vLLM's defaults: both lookup bounds 5 when neither is given, else the one given for both.
        k = _count("num_speculative_tokens", value.get("num_speculative_tokens"))
        # Each bound given is checked under its own name, then stands in for the other when that is missing.
        given_low, given_high = (
            None if value.get(key) is None else _count(key, value[key])
            for key in ("prompt_lookup_min", "prompt_lookup_max")
        )
        low = given_low or given_high or 5
        high = given_high or given_low or 5
        if low > high:
            raise ConfigError(
                f"speculative_config prompt_lookup_min={low} is larger than prompt_lookup_max={high}."
            )
        return cls(method, k, high, low, value.get("model"))


def _count(key: str, number: Any) -> int:
    if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 64:
        raise ConfigError(f"speculative_config {key}={number!r} must be an integer in [1, 64].")
    return number


def resolve_speculative_config(
    value: dict[str, Any] | str | None,
    target: ModelConfig,
    device: str,
    tensor_parallel_size: int,
    download_dir: str | None = None,
) -> SpeculativeConfig | None:
    """The user's speculative_config, with a draft model's config read (never its weights) and checked
    against the target's."""
    if value is None:
        return None
    spec = SpeculativeConfig.from_user(value)
    if spec.model is None:  # ngram: from_user gives every draft_model a model
        return spec
    if tensor_parallel_size != 1:
        raise ConfigError(
            "A draft model (speculative_config) runs with --tensor-parallel-size 1 only; "
            'use {"method": "ngram"} with tensor parallelism.'
        )
    # A hub id draft model becomes its local snapshot here, as the model does (utils/hub.py).
    draft = load_model_config(
        resolve_model_path(spec.model, None, download_dir, "speculative_config model"),
        dtype=target.dtype,
        device=device,
        max_model_len=target.max_model_len,
        served_model_name=None,
        seed=target.seed,
        load_format=target.load_format,
        tokenizer=None,
        max_logprobs=target.max_logprobs,
    )
    if draft.vocab_size != target.vocab_size:
        raise ConfigError(
            f"The draft model {spec.model} has a vocabulary of {draft.vocab_size} tokens, the model "
            f"{target.vocab_size}: a draft model must share the model's tokenizer."
        )
    return replace(spec, draft_model_config=draft)
