"""The model's sampling defaults from its generation_config.json (vLLM's `--generation-config`): applied
to the requests that leave those fields unset, on the server and offline."""

import json
import os
from typing import Any

from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.logger import init_logger
from pagedserve.sampling_params import SamplingParams

logger = init_logger(__name__)

# generation_config.json key -> SamplingParams field.
_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
_KEYS = {field: key for key, field in _FIELDS.items()}
# transformers' own defaults: a file value equal to one is no default, as in vLLM (which reads the file's
# difference from them), so a file's "top_k": 50 leaves top-k off there and here.
_TRANSFORMERS_DEFAULTS: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 50,
    "repetition_penalty": 1.0,
}


def generation_defaults(
    source: str, model: str, override: str | dict[str, Any] | None = None
) -> dict[str, Any]:
    """SamplingParams field -> default. `source` (--generation-config): "auto" reads `model`'s folder,
    "vllm" nothing, else a folder holding generation_config.json. `override`
    (--override-generation-config, JSON) wins over the file. Raises ConfigError naming the file or flag."""
    if source == "vllm":
        found: dict[str, Any] = {}
        path = None
    else:
        folder = model if source == "auto" else source
        if source != "auto" and not os.path.isdir(folder):
            raise ConfigError(f"--generation-config {source!r} is neither auto, vllm nor a folder.")
        path = os.path.join(folder, "generation_config.json") if os.path.isdir(folder) else None
        found = _read(path) if path is not None and os.path.isfile(path) else {}
    found = {key: value for key, value in found.items() if not _is_transformers_default(key, value)}
    defaults = _validated(
        found, path or "generation_config.json", "fix it, or start with --generation-config vllm to ignore it"
    )
    defaults.update(_validated(_override(override), "--override-generation-config", "fix the flag's JSON"))
    if defaults:
        logger.info(
            "Default sampling parameters from the model's generation_config (requests that set a field "
            "win; --generation-config vllm turns them off): %s.",
            defaults,
        )
    return defaults


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read {path}: {exc} (--generation-config vllm ignores it).") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object (--generation-config vllm ignores it).")
    return data


def _override(value: str | dict[str, Any] | None) -> dict[str, Any]:
    if value is None or isinstance(value, dict):
        return dict(value or {})
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise ConfigError(f"--override-generation-config is not valid JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise ConfigError('--override-generation-config must be a JSON object, e.g. {"temperature": 0.5}.')
    return data


def _is_transformers_default(key: str, value: Any) -> bool:
    return type(value) in (int, float) and _TRANSFORMERS_DEFAULTS.get(key) == value


def _validated(values: dict[str, Any], source: str, hint: str) -> dict[str, Any]:
    """The sampling keys of `values` as SamplingParams fields, checked by SamplingParams itself (the rules
    of a request's fields), so a default that passes here never fails a request. A key set to null
    counts as unset."""
    defaults = {field: values[key] for key, field in _FIELDS.items() if values.get(key) is not None}
    try:
        SamplingParams(**defaults)
    except InvalidRequestError as exc:
        key = _KEYS.get(str(exc.param), str(exc.param))
        raise ConfigError(f"{source}: {key}={values.get(key)!r} is invalid: {exc} ({hint}).") from exc
    return defaults
