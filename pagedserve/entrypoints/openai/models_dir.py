"""The models a pool serves, by name: --models-dir and --model NAME=PATH. Each GGUF file (`name.gguf`) and
each HF folder (a subfolder with a config.json) directly in the directory is a model named after it; each
--model NAME=PATH adds one under NAME. The listing is taken once, at startup: a request's model name is only
ever looked up in it, so no name (`..`, an absolute path, a slash) can make the server open anything else,
and a symlink that leads outside the directory is left out."""

import os
from dataclasses import dataclass

from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.logger import init_logger

logger = init_logger(__name__)

MAX_MODEL_NAME_CHARS = 128  # of a --model NAME=PATH's NAME
_SHOWN_NAME_CHARS = 200  # of an unknown model name in its 404's message
_LISTED_NAMES = 20  # names a 404 lists (GET /v1/models has them all)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


@dataclass(frozen=True)
class ModelFile:
    """One servable model of the pool."""

    name: str
    path: str  # resolved (no symlink): inside --models-dir, or a --model NAME=PATH's
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
        model = _model_file(entry.name.removesuffix(".gguf"), path, entry.name.endswith(".gguf"))
        if model is not None:
            models[model.name] = model
    if not models:
        raise ConfigError(
            f"--models-dir {models_dir!r} holds no model: put GGUF files (name.gguf) or HF folders (with "
            "a config.json) directly in it."
        )
    return models


def _model_file(name: str, path: str, gguf_name: bool) -> ModelFile | None:
    """`path` (resolved) as the model `name` when it is a GGUF file (`gguf_name`: it was named *.gguf; a
    symlink's target may be a blob without the suffix) or a HF folder with a config.json, else None."""
    if os.path.isfile(path) and gguf_name:
        stat = os.stat(path)
        return ModelFile(name, path, stat.st_size, stat.st_mtime)
    if os.path.isfile(os.path.join(path, "config.json")):
        weights = [os.path.join(path, file) for file in os.listdir(path) if file.endswith(_WEIGHT_SUFFIXES)]
        size = sum(os.path.getsize(file) for file in weights)
        return ModelFile(name, path, size, os.stat(path).st_mtime)
    return None


def named_models(specs: list[str]) -> dict[str, ModelFile]:
    """--model NAME=PATH (repeated) by name. Raises ConfigError naming the flag for a bad name, a path
    that is no model, or a name given twice."""
    models: dict[str, ModelFile] = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        _check_name(name, spec)
        model = _model_file(name, os.path.realpath(path), path.endswith(".gguf"))
        if model is None:
            raise ConfigError(
                f"--model {spec!r}: {path!r} is neither a GGUF file (.gguf) nor a HF folder with a config.json."
            )
        if name in models:
            raise ConfigError(f"--model {spec!r}: the name {name!r} is given twice; give each model its own.")
        models[name] = model
    return models


def _check_name(name: str, spec: str) -> None:
    """A served name is looked up, never opened, but it shows in listings and paths of the API: bounded,
    printable, no `..` part, no leading `/`."""
    if not name or len(name) > MAX_MODEL_NAME_CHARS or not name.isprintable() or name != name.strip():
        raise ConfigError(
            f"--model {spec[:MAX_MODEL_NAME_CHARS]!r}: NAME must be 1 to {MAX_MODEL_NAME_CHARS} printable "
            "characters without surrounding spaces (--model NAME=PATH)."
        )
    if name.startswith("/") or ".." in name.split("/"):
        raise ConfigError(f"--model {spec!r}: NAME must not start with '/' nor hold a '..' part.")


def served_models(models_dir: str | None, named: list[str]) -> dict[str, ModelFile]:
    """The pool's models: --models-dir's and --model NAME=PATH's. Raises ConfigError for a name both
    give, naming the flags."""
    listed = scan_models_dir(models_dir) if models_dir else {}
    for name, model in named_models(named).items():
        if name in listed:
            raise ConfigError(
                f"--model {name}={model.path}: --models-dir {models_dir!r} already serves a model named "
                f"{name!r}; choose another NAME."
            )
        listed[name] = model
    return listed


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
