"""Weight quantization schemes, one registry (names as vLLM's --quantization where vLLM has them)."""
from pagedserve.errors import ConfigError
from pagedserve.quantization.base import QuantizationConfig
from pagedserve.quantization.gguf import GGUFConfig
from pagedserve.quantization.rtn import Int4Config, Int8Config

# NOTE: config.QUANTIZATION_METHODS (L0, validated before torch loads) must list these same names.
QUANTIZATION_CONFIGS: dict[str, type[QuantizationConfig]] = {
    config.name: config for config in (GGUFConfig, Int8Config, Int4Config)}


def get_quantization_config(name: str | None) -> QuantizationConfig | None:
    """The scheme `name` resolved by EngineConfig (None: unquantized)."""
    if name is None:
        return None
    if name not in QUANTIZATION_CONFIGS:
        raise ConfigError(f"Quantization {name!r} is not supported; --quantization must be one of "
                          f"{', '.join(sorted(QUANTIZATION_CONFIGS))} or none.")
    return QUANTIZATION_CONFIGS[name]()
