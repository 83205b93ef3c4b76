"""Weight quantization schemes, one registry (names as vLLM's --quantization where vLLM has them)."""

from pagedserve.quantization.base import QuantizationConfig
from pagedserve.utils.registry import Registry

# NOTE: config/quantization.py's QUANTIZATION_METHODS (validated before torch loads) lists the same names.
QUANTIZATION_CONFIGS: "Registry[QuantizationConfig]" = Registry("Quantization", "--quantization")
QUANTIZATION_CONFIGS.register("gguf", "pagedserve.quantization.gguf:GGUFConfig")
QUANTIZATION_CONFIGS.register("int8", "pagedserve.quantization.rtn:Int8Config")
QUANTIZATION_CONFIGS.register("int4", "pagedserve.quantization.rtn:Int4Config")
QUANTIZATION_CONFIGS.register("gptq", "pagedserve.quantization.gptq:GPTQConfig")
QUANTIZATION_CONFIGS.register("awq", "pagedserve.quantization.awq:AWQConfig")
QUANTIZATION_CONFIGS.register("fp8", "pagedserve.quantization.fp8:Fp8Config")
QUANTIZATION_CONFIGS.register("mxfp4", "pagedserve.quantization.mxfp4:Mxfp4Config")


def get_quantization_config(
    name: str | None, quant_config: dict[str, object] | None = None
) -> QuantizationConfig | None:
    """The scheme `name` as resolved by the config (None: unquantized), with the checkpoint's
    `quantization_config`. Raises ConfigError for an unknown name."""
    return None if name is None else QUANTIZATION_CONFIGS.load(name).from_checkpoint(quant_config or {})
