"""--quantization: the weight-quantization scheme, given or detected from the checkpoint (config.json's
`quantization_config`, or a GGUF file). The schemes themselves live in `pagedserve/quantization/`."""

from typing import TYPE_CHECKING, Literal, get_args

from pagedserve.config.int4_checkpoint import check_architecture, parse_int4_checkpoint
from pagedserve.errors import ConfigError
from pagedserve.families import MXFP4_ARCHITECTURES
from pagedserve.logger import init_logger

if TYPE_CHECKING:
    from pagedserve.config.model import ModelConfig

logger = init_logger(__name__)

# Each scheme but none is registered in quantization/__init__.py (a test checks that the two agree).
QuantizationName = Literal["gguf", "int8", "int4", "gptq", "awq", "fp8", "mxfp4", "none"]
QUANTIZATION_METHODS: tuple[str, ...] = get_args(QuantizationName)[:-1]
_SUPPORTED = f"{', '.join(QUANTIZATION_METHODS)} or none"
_CHECKPOINT_FORMATS = ("gptq", "awq")  # read from the checkpoint's tensors, never applied online
_STORED_ONLY = ("fp8", "mxfp4")  # loaded as the checkpoint stores them, never replaced by another scheme
# --linear-backend: how quantized weights (ggml blocks: GGUF, int8/int4, GPTQ/AWQ repacked) are multiplied.
LinearBackendName = Literal["auto", "native", "triton", "torch"]
LINEAR_BACKENDS: tuple[str, ...] = get_args(LinearBackendName)


def checkpoint_quantization_config(model: "ModelConfig") -> dict[str, object]:
    """config.json's `quantization_config` (empty when there is none)."""
    quant_config = getattr(model.hf_config, "quantization_config", None) or {}
    return dict(quant_config) if isinstance(quant_config, dict) else dict(vars(quant_config))


def checkpoint_quantization(model: "ModelConfig") -> str | None:
    """What the checkpoint is quantized with: gguf for a GGUF file, else config.json's quant_method."""
    if model.gguf_file:
        return "gguf"
    method = checkpoint_quantization_config(model).get("quant_method")
    return str(method) if method else None


def resolve_linear_backend(requested: str, device: str) -> str:
    """--linear-backend on `device`: auto is native (the C++ kernels) on CPU, triton elsewhere. Raises
    ConfigError for an unknown name and native off the CPU (triton on CPU outside Triton's interpreter is
    refused where the kernels load: `quantization/ggml_backend.py`)."""
    if requested not in LINEAR_BACKENDS:
        raise ConfigError(
            f"linear_backend={requested!r} is not supported; --linear-backend must be one of "
            f"{', '.join(LINEAR_BACKENDS)}."
        )
    if requested == "auto":
        return "native" if device == "cpu" else "triton"
    if requested == "native" and device != "cpu":
        raise ConfigError(
            f"--linear-backend native runs the C++ CPU kernels, but the device is {device}; use "
            "--linear-backend triton (or torch, the reference), or --device cpu."
        )
    return requested


def resolve_quantization(requested: str | None, model: "ModelConfig") -> str | None:
    """The scheme to load `model` with (None: unquantized). Raises ConfigError naming the choices. Every
    scheme runs on every device: `resolve_linear_backend` has refused a backend without kernels there."""
    detected = checkpoint_quantization(model)
    _check_supported(requested, detected, model)
    _check_checkpoint_matches(requested, detected)
    if requested is None:
        return _detected_scheme(detected, model)
    _check_online_scheme(requested, detected, model)
    return None if requested == "none" else requested


def _check_supported(requested: str | None, detected: str | None, model: "ModelConfig") -> None:
    """Both schemes are ones pagedserve knows, and a GPTQ/AWQ checkpoint is one it can load."""
    if requested not in (None, *get_args(QuantizationName)):
        raise ConfigError(
            f"quantization={requested!r} is not supported; --quantization must be one of {_SUPPORTED}."
        )
    if detected is not None and detected not in QUANTIZATION_METHODS:
        raise ConfigError(
            f"The checkpoint is quantized with {detected!r} (config.json quantization_config), "
            f"which pagedserve does not support; supported: {_SUPPORTED}."
        )
    if detected == "mxfp4" and model.architecture not in MXFP4_ARCHITECTURES:
        raise ConfigError(
            f"An mxfp4 checkpoint of {model.architecture} cannot load: MXFP4 experts are implemented for "
            f"{', '.join(MXFP4_ARCHITECTURES)} only."
        )
    if detected in _CHECKPOINT_FORMATS:
        # NOTE: refuses what we cannot load; the backend's device is checked as the layers are built,
        # since `pagedserve plan` resolves this config as on a GPU.
        parse_int4_checkpoint(detected, checkpoint_quantization_config(model))
        check_architecture(detected, model.architecture)


def _check_checkpoint_matches(requested: str | None, detected: str | None) -> None:
    """The schemes that only exist in a checkpoint (GPTQ, AWQ, fp8) are loaded as they are: never asked
    for without such a checkpoint, never overridden when the checkpoint has one."""
    if requested == "none" and detected in _CHECKPOINT_FORMATS:
        raise ConfigError(
            f"--quantization none cannot load a {detected} checkpoint (its weights exist only as 4-bit "
            f"groups); leave --quantization unset or pass {detected}."
        )
    if requested in _CHECKPOINT_FORMATS and detected != requested:
        raise ConfigError(
            f"--quantization {requested} needs a checkpoint quantized with {requested} (config.json "
            f"quantization_config.quant_method), but this one is {detected or 'not quantized'}."
        )
    if detected in _STORED_ONLY and requested not in (None, detected):
        raise ConfigError(
            f"--quantization {requested} cannot load an {detected} checkpoint (its weights exist only in "
            f"{detected}); leave --quantization unset or pass {detected}."
        )
    if requested == "mxfp4" and detected != "mxfp4":
        raise ConfigError(
            "--quantization mxfp4 loads checkpoints whose experts ship in MXFP4 (config.json "
            f"quantization_config.quant_method mxfp4), but this one is {detected or 'not quantized'}."
        )
    if requested == "fp8" and detected != "fp8":
        raise ConfigError(
            "--quantization fp8 loads checkpoints quantized to fp8 (config.json quantization_config."
            f"quant_method fp8), but this one is {detected or 'not quantized'}; use int8 to quantize a "
            "float checkpoint online."
        )


def _detected_scheme(detected: str | None, model: "ModelConfig") -> str | None:
    """With --quantization unset: the checkpoint's own scheme, unless its weights end up as floats
    anyway (dummy weights)."""
    if detected in ("gguf", *_CHECKPOINT_FORMATS) and model.load_format == "dummy":
        logger.info("Dummy weights are random floats: the checkpoint's %s layout is not used.", detected)
        return None
    return detected


def _check_online_scheme(requested: str, detected: str | None, model: "ModelConfig") -> None:
    """gguf needs a GGUF file, and int8/int4 quantize only float weights."""
    if requested == "gguf" and not model.gguf_file:
        raise ConfigError("--quantization gguf needs a GGUF file (--model *.gguf).")
    if requested in ("int8", "int4") and detected is not None:
        raise ConfigError(
            f"--quantization {requested} quantizes a float checkpoint, but this one is already "
            f"{detected}; use --quantization none (GGUF) or leave it unset."
        )
