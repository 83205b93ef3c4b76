"""The model's sampling defaults from its generation_config.json (vLLM's `--generation-config`): applied
to the requests that leave those fields unset, on the server and offline."""

import json
import math
import os
from typing import Any

from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger

logger = init_logger(__name__)

# generation_config.json key -> SamplingParams field, with the range each must be in.
_FIELDS: dict[str, tuple[str, float, float]] = {
    "temperature": ("temperature", 0.0, 1e6),
    "top_p": ("top_p", 0.0, 1.0),
    "top_k": ("top_k", -1, 2**63 - 1),
    "min_p": ("min_p", 0.0, 1.0),
    "repetition_penalty": ("repetition_penalty", 1e-6, 1e6),
    "max_new_tokens": ("max_tokens", 1, 2**63 - 1),
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
    defaults = _validated(found, path or "generation_config.json")
    defaults.update(_validated(_override(override), "--override-generation-config"))
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


def _validated(values: dict[str, Any], source: str) -> dict[str, Any]:
    """The known sampling keys of `values`, as SamplingParams fields; out-of-range values are errors.
    A key set to null counts as unset."""
    defaults: dict[str, Any] = {}
    for key, (field, low, high) in _FIELDS.items():
        value = values.get(key)
        if value is None:
            continue
        integer = field in ("top_k", "max_tokens")
        kind_ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not kind_ok or not math.isfinite(value) or not low <= value <= high:
            raise ConfigError(
                f"{source}: {key}={value!r} must be {'an integer' if integer else 'a number'} in "
                f"[{low}, {high}] (fix it, or start with --generation-config vllm to ignore the file)."
            )
        defaults[field] = value
    return defaults
