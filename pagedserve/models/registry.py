"""Architecture name (config.json's `architectures`) -> model class, imported on demand.
The supported set is config.MODEL_ARCHITECTURES: family `t` lives in models/t.py."""
import importlib

from torch import nn

from pagedserve.config import MODEL_ARCHITECTURES
from pagedserve.errors import ConfigError

_MODULES = {arch: model_type for model_type, arch in MODEL_ARCHITECTURES.items()}


def supported_architectures() -> list[str]:
    return sorted(_MODULES)


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _MODULES:
        raise ConfigError(f"Model architecture {architecture!r} is not supported. Supported "
                          f"architectures: {', '.join(supported_architectures())}.")
    return getattr(importlib.import_module(f"pagedserve.models.{_MODULES[architecture]}"), architecture)
