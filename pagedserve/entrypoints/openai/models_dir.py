"""--models-dir: the models a pool serves, by name. Each GGUF file (`name.gguf`) and each HF folder (a
subfolder with a config.json) directly in the directory is a model named after it. The listing is taken
once, at startup: a request's model name is only ever looked up in it, so no name (`..`, an absolute
path, a slash) can make the server open anything else, and a symlink that leads outside the directory is
left out."""

import os
from dataclasses import dataclass

from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.logger import init_logger

logger = init_logger(__name__)

_SHOWN_NAME_CHARS = 200  # of an unknown model name in its 404's message
_LISTED_NAMES = 20  # names a 404 lists (GET /v1/models has them all)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


@dataclass(frozen=True)
class ModelFile:
    """One servable model of the directory."""

    name: str
    path: str  # resolved (no symlink), inside the directory
    size_bytes: int  # its weights on disk: what the pool's memory budget counts
    modified: float  # time.time() of the last change, for listings


def scan_models_dir(models_dir: str) -> dict[str, ModelFile]:
    """Every model in `models_dir`, by name. Raises ConfigError when the directory cannot be read or holds
    no model."""
    root = os.path.realpath(models_dir)
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError as exc:
        raise ConfigError(f"--models-dir {models_dir!r} cannot be read: {exc.strerror}.") from None
    models = {}
    for entry in entries:
        path = os.path.realpath(entry.path)
        if os.path.commonpath([root, path]) != root:
            logger.warning("--models-dir: %s leads outside the directory and is not served.", entry.name)
            continue
        if os.path.isfile(path) and entry.name.endswith(".gguf"):
            name = entry.name.removesuffix(".gguf")
            stat = os.stat(path)
            models[name] = ModelFile(name, path, stat.st_size, stat.st_mtime)
        elif os.path.isfile(os.path.join(path, "config.json")):
            weights = [
                os.path.join(path, file) for file in os.listdir(path) if file.endswith(_WEIGHT_SUFFIXES)
            ]
            size = sum(os.path.getsize(file) for file in weights)
            models[entry.name] = ModelFile(entry.name, path, size, os.stat(path).st_mtime)
    if not models:
        raise ConfigError(
            f"--models-dir {models_dir!r} holds no model: put GGUF files (name.gguf) or HF folders (with "
            "a config.json) directly in it."
        )
    return models


def unknown_model(name: str, served: list[str]) -> InvalidRequestError:
    """The 404 for a name the pool does not serve."""
    # NOTE: the name as sent, cut short: a 100 kB body field is not echoed back whole.
    shown = name if len(name) <= _SHOWN_NAME_CHARS else name[:_SHOWN_NAME_CHARS] + "..."
    listed = ", ".join(f"`{model}`" for model in served[:_LISTED_NAMES])
    more = f" and {len(served) - _LISTED_NAMES} more" if len(served) > _LISTED_NAMES else ""
    return InvalidRequestError(
        f"The model `{shown}` does not exist: this server serves {listed}{more} (the files of "
        "--models-dir; see GET /v1/models).",
        param="model",
        status_code=404,
    )
