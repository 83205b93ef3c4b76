"""Hugging Face Hub model ids (`org/name`, `org/name:Q4_K_M` for one GGUF file of a repo) resolved to a
local folder or file through huggingface_hub's cache: downloaded (with its progress bars) when online,
read from the cache alone with HF_HUB_OFFLINE=1. Local paths pass through unchanged."""

import os
import re

from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger

logger = init_logger(__name__)

_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_QUANT = re.compile(r"^[\w.-]+$")
# What a checkpoint folder needs besides its weights: configs, tokenizer files, chat templates.
_CONFIG_FILES = ["*.json", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.txt"]


def is_hub_id(model: str) -> bool:
    """`org/name` or `org/name:QUANT`, and not an existing local path."""
    return not os.path.exists(model) and _REPO_ID.match(model.split(":", 1)[0]) is not None


def resolve_model_path(
    model: str, revision: str | None = None, download_dir: str | None = None, what: str = "--model"
) -> str:
    """The local path of `model`: itself when it is not a hub id; else the snapshot folder of its
    checkpoint (safetensors, else .bin weights, with configs and tokenizer), or the path of the GGUF file
    `org/name:QUANT` names. Raises ConfigError naming the repo, the revision and the cache folder."""
    if not is_hub_id(model):
        return model
    repo_id, _, quant = model.partition(":")
    if quant:
        folder = _snapshot(repo_id, revision, download_dir, [_gguf_pattern(repo_id, quant, what)], what)
        return _gguf_file(folder, repo_id, quant, what)
    folder = _snapshot(repo_id, revision, download_dir, [*_CONFIG_FILES, "*.safetensors"], what)
    if not any(name.endswith(".safetensors") for name in os.listdir(folder)):
        folder = _snapshot(repo_id, revision, download_dir, [*_CONFIG_FILES, "*.bin"], what)
    logger.info("Model %s (revision %s): %s.", repo_id, revision or "main", folder)
    return folder


def _snapshot(
    repo_id: str, revision: str | None, cache_dir: str | None, patterns: list[str], what: str
) -> str:
    from huggingface_hub import constants, snapshot_download  # NOTE: lazy: only hub ids need it
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = cache_dir or constants.HF_HUB_CACHE
    try:
        return str(
            snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=patterns)
        )
    except LocalEntryNotFoundError as exc:
        raise ConfigError(
            f"{what} {repo_id!r} (revision {revision or 'main'}) is not in the Hugging Face cache {cache} "
            f"and downloading is off (HF_HUB_OFFLINE=1): download it first (huggingface-cli download "
            f"{repo_id}), point --download-dir / HF_HUB_CACHE at the cache that holds it, or unset "
            "HF_HUB_OFFLINE."
        ) from exc
    except HFValidationError as exc:
        raise ConfigError(f"{what} {repo_id!r} is neither a local path nor a valid hub id: {exc}") from exc
    except Exception as exc:  # huggingface_hub's network and repository errors
        raise ConfigError(
            f"{what} {repo_id!r} (revision {revision or 'main'}) could not be fetched into {cache}: {exc}"
        ) from exc


def _gguf_pattern(repo_id: str, quant: str, what: str) -> str:
    """The glob of the GGUF files whose name holds `quant` in any case (huggingface_hub's patterns are
    case-sensitive, and repos write Q4_K_M as well as q4_k_m)."""
    if not _QUANT.match(quant):
        raise ConfigError(
            f"{what} {repo_id}:{quant}: after the colon comes a GGUF quantization type such as Q4_K_M "
            "(letters, digits, '_', '-' or '.')."
        )
    return "*" + "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in quant) + "*.gguf"


def _gguf_file(folder: str, repo_id: str, quant: str, what: str) -> str:
    """The one GGUF file of `folder` whose name holds `quant` (any case)."""
    files = sorted(name for name in os.listdir(folder) if name.endswith(".gguf"))
    matches = [name for name in files if quant.lower() in name.lower()]
    if len(matches) != 1:
        found = "none does" if not matches else f"{len(matches)} do: {', '.join(matches)}"
        raise ConfigError(
            f"{what} {repo_id}:{quant} must name one GGUF file of the repo by its quantization, but "
            f"{found} (GGUF files here: {', '.join(files) or 'none'})."
        )
    return os.path.join(folder, matches[0])
