"""Hugging Face Hub model ids (`org/name`, `org/name:Q4_K_M` for one GGUF file of a repo) resolved to a
local folder or file through huggingface_hub's cache: downloaded (with its progress bars) when online,
read from the cache alone with HF_HUB_OFFLINE=1. A GGUF tag's file is chosen from the repo's listing
(hub_gguf.py), then fetched alone. Local paths pass through unchanged."""

import glob
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.utils.hub_gguf import check_quant, choose_gguf

logger = init_logger(__name__)

_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
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
    `org/name:QUANT` names. Raises ConfigError naming the repo, the revision and the cache folder; for a
    split GGUF before anything is downloaded (the loader reads one file)."""
    if not is_hub_id(model):
        return model
    repo_id, _, quant = model.partition(":")
    if quant:
        check_quant(repo_id, quant, what)
        # NOTE: chosen from the listing, so that only its file (its parts) is downloaded, and only once
        # the tag names one.
        chosen = choose_gguf(_repo_files(repo_id, revision, download_dir, what), repo_id, quant, what)
        if len(chosen.files) > 1:
            raise ConfigError(
                f"{what} {model} names a GGUF split into {len(chosen.files)} files ({chosen.files[0]}, ...); "
                "pagedserve loads a GGUF from one file: merge the parts first (llama.cpp's "
                "`llama-gguf-split --merge FIRST_PART OUT.gguf`) and pass the merged file."
            )
        folder = _snapshot(repo_id, revision, download_dir, [glob.escape(f) for f in chosen.files], what)
        return os.path.join(folder, chosen.files[0])
    folder = _snapshot(repo_id, revision, download_dir, [*_CONFIG_FILES, "*.safetensors"], what)
    if not any(name.endswith(".safetensors") for name in os.listdir(folder)):
        folder = _snapshot(repo_id, revision, download_dir, [*_CONFIG_FILES, "*.bin"], what)
    logger.info("Model %s (revision %s): %s.", repo_id, revision or "main", folder)
    return folder


def _repo_files(repo_id: str, revision: str | None, cache_dir: str | None, what: str) -> list[str]:
    """The repo's file paths: the Hub's listing, or with HF_HUB_OFFLINE=1 the cached snapshot's files."""
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        folder = _snapshot(repo_id, revision, cache_dir, [], what)  # NOTE: no pattern: the folder alone
        return [
            os.path.relpath(os.path.join(root, name), folder)
            for root, _, names in os.walk(folder)
            for name in names
        ]
    with _hub_errors(repo_id, revision, cache_dir, what):
        return HfApi().list_repo_files(repo_id, revision=revision)


def _snapshot(
    repo_id: str, revision: str | None, cache_dir: str | None, patterns: list[str], what: str
) -> str:
    from huggingface_hub import snapshot_download  # NOTE: lazy: only hub ids need it

    with _hub_errors(repo_id, revision, cache_dir, what):
        return str(
            snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=patterns)
        )


@contextmanager
def _hub_errors(repo_id: str, revision: str | None, cache_dir: str | None, what: str) -> Iterator[None]:
    """huggingface_hub's errors as ConfigErrors naming the repo, the revision and the cache."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = cache_dir or constants.HF_HUB_CACHE
    try:
        yield
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
            f"{what} {repo_id!r} (revision {revision or 'main'}) could not be fetched into {cache}: {exc} "
            "(to use the cache alone, set HF_HUB_OFFLINE=1)"
        ) from exc
