"""Every registry names exactly the config's choices, loads each entry, and refuses unknown names."""

import subprocess
import sys
from typing import get_args

import pytest

from pagedserve.attention.backends import ATTENTION_BACKENDS
from pagedserve.attention.backends.base import AttentionBackend
from pagedserve.config import MODEL_ARCHITECTURES, AttentionBackendName, ExecutorBackend
from pagedserve.config.multimodal import MULTIMODAL_ARCHITECTURES
from pagedserve.config.pooling import DECODER_CLASSIFIER_ARCHITECTURES, ENCODER_ARCHITECTURES
from pagedserve.config.quantization import QUANTIZATION_METHODS
from pagedserve.errors import ConfigError
from pagedserve.executor import EXECUTORS
from pagedserve.executor.base import Executor
from pagedserve.models.interface import CausalLM, EncoderModel, SequenceClassifier
from pagedserve.models.registry import DECODER_CLASSIFIERS, ENCODER_MODELS, MODELS
from pagedserve.quantization import QUANTIZATION_CONFIGS
from pagedserve.quantization.base import QuantizationConfig
from pagedserve.utils.registry import Registry

REGISTRIES = [
    (ATTENTION_BACKENDS, set(get_args(AttentionBackendName)) - {"auto"}, AttentionBackend),
    (EXECUTORS, set(get_args(ExecutorBackend)), Executor),
    (MODELS, set(MODEL_ARCHITECTURES.values()) | set(MULTIMODAL_ARCHITECTURES.values()), CausalLM),
    (ENCODER_MODELS, set(ENCODER_ARCHITECTURES), EncoderModel),
    (DECODER_CLASSIFIERS, set(DECODER_CLASSIFIER_ARCHITECTURES), SequenceClassifier),
    (QUANTIZATION_CONFIGS, set(QUANTIZATION_METHODS), QuantizationConfig),
]


@pytest.mark.parametrize("registry,choices,base", REGISTRIES, ids=lambda x: getattr(x, "kind", ""))
def test_registry_keys_equal_the_config_choices(registry: Registry, choices: set[str], base: type) -> None:
    assert set(registry.names()) == choices
    for name in registry.names():
        assert issubclass(registry.load(name), base)


@pytest.mark.parametrize("registry,choices,base", REGISTRIES, ids=lambda x: getattr(x, "kind", ""))
def test_unknown_name_names_the_choices_and_the_flag(
    registry: Registry, choices: set[str], base: type
) -> None:
    with pytest.raises(
        ConfigError,
        match=f"'nope' is not supported. Supported: {', '.join(sorted(choices))} "
        rf"\({registry.flag}\)",
    ):
        registry.load("nope")


def test_a_name_registers_once() -> None:
    registry: Registry[object] = Registry("Thing", "--thing")
    registry.register("a", "builtins:object")
    with pytest.raises(ValueError, match="'a' is registered twice"):
        registry.register("a", "builtins:dict")


def test_executor_interface_imports_no_executor() -> None:
    """The registry breaks the old cycle: base.py never imports the executors that subclass it."""
    code = (
        "import sys, pagedserve.executor.base, pagedserve.executor; "
        "print(sorted(m for m in sys.modules if m.startswith('pagedserve.executor.')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['pagedserve.executor.base']"
