"""Architecture name (config.json's `architectures`) -> model class, imported on demand."""
import importlib

from torch import nn

from pagedserve.errors import ConfigError

_MODELS = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("mistral", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _MODELS:
        raise ConfigError(f"Model architecture {architecture!r} is not supported. Supported "
                          f"architectures: {', '.join(supported_architectures())}.")
    module, name = _MODELS[architecture]
    return getattr(importlib.import_module(f"pagedserve.models.{module}"), name)
