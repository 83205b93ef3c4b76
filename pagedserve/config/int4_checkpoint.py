"""What a GPTQ or AWQ checkpoint's config.json `quantization_config` says, validated when the engine
config is made (before any weight is read; no torch here). The tensors themselves are read by
`quantization/gptq.py` and `quantization/awq.py`."""

from collections.abc import Mapping
from dataclasses import dataclass

from pagedserve.config.model import SEPARATE_PROJECTION_ARCHITECTURES
from pagedserve.errors import ConfigError

BLOCK = 32  # weights per block of the native Q4_0/Q4_1 kernels the groups are repacked into
SUPPORTED = (
    "gptq: bits 4, group_size a multiple of 32 (32, 64, 128, ...) or -1, desc_act true or false, sym true or "
    "false, checkpoint_format gptq or gptq_v2; awq: bits 4, group_size a multiple of 32, zero_point true, "
    "version gemm"
)

# NOTE: Phi-3 and Falcon split fused checkpoint tensors by rows, which GPTQ's packing does not allow;
# experts are not quantized layers yet.
ARCHITECTURES = SEPARATE_PROJECTION_ARCHITECTURES


@dataclass(frozen=True)
class Int4CheckpointFormat:
    """One checkpoint's 4-bit group-wise layout."""

    method: str  # "gptq" or "awq"
    group_size: int  # weights per group along the input dimension; -1: one group per row
    desc_act: bool  # GPTQ act-order: g_idx assigns input columns to groups out of order
    zeros_minus_one: bool  # GPTQ v1 ("gptq" format) stores every zero point minus one
    sym: bool  # every zero point is 8 (symmetric GPTQ)

    @property
    def bits_per_weight(self) -> float:
        """Memory per weight once loaded (`quantization/int4_groups.py`): 4 bits, an fp16 scale per block of
        32 and, unless symmetric, a float32 offset per group (per row with group_size -1: negligible)."""
        offsets = 0 if self.sym or self.group_size == -1 else 32 / self.group_size
        return 4 + 16 / BLOCK + offsets


def _refuse(method: str, what: str) -> ConfigError:
    return ConfigError(
        f"This {method} checkpoint has {what} (config.json quantization_config), which pagedserve does not "
        f"support. Supported: {SUPPORTED}."
    )


def _field(quant_config: Mapping[str, object], *names: str, default: object = None) -> object:
    """The first of `names` present (AutoAWQ's own quant_config.json spells some fields differently)."""
    return next((quant_config[name] for name in names if name in quant_config), default)


def _group_size(method: str, quant_config: Mapping[str, object], allow_whole_rows: bool) -> int:
    group_size = _field(quant_config, "group_size", "q_group_size", default=128)
    if isinstance(group_size, int) and not isinstance(group_size, bool):
        if group_size == -1 and allow_whole_rows or group_size > 0 and group_size % BLOCK == 0:
            return group_size
    raise _refuse(method, f"group_size={group_size!r}")


def check_architecture(method: str, architecture: str) -> None:
    """Raises ConfigError when `architecture`'s checkpoints cannot be read as 4-bit groups."""
    if architecture not in ARCHITECTURES:
        raise ConfigError(
            f"{method} checkpoints of {architecture} are not supported (fused projections in the checkpoint, "
            f"or experts); supported: {', '.join(ARCHITECTURES)}."
        )


def parse_int4_checkpoint(method: str, quant_config: Mapping[str, object]) -> Int4CheckpointFormat:
    """The layout of a `gptq` or `awq` checkpoint. Raises ConfigError naming what is supported."""
    bits = _field(quant_config, "bits", "w_bit", default=4)
    if bits != 4 or isinstance(bits, bool):
        raise _refuse(method, f"bits={bits!r}")
    if method == "awq":
        version = str(_field(quant_config, "version", default="gemm")).lower()
        if version != "gemm":  # GEMV/Marlin layouts pack differently
            raise _refuse(method, f"version={version!r}")
        if _field(quant_config, "zero_point", default=True) is not True:
            raise _refuse(method, "zero_point=false")
        if _field(quant_config, "modules_to_not_convert", default=None):
            raise _refuse(method, "modules_to_not_convert (layers left in float)")
        return Int4CheckpointFormat(method, _group_size(method, quant_config, False), False, False, False)
    checkpoint_format = _field(quant_config, "checkpoint_format", default="gptq")
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise _refuse(method, f"checkpoint_format={checkpoint_format!r}")
    if _field(quant_config, "lm_head", default=False):
        raise _refuse(method, "a quantized lm_head")
    if _field(quant_config, "dynamic", default=None):
        raise _refuse(method, "per-module 'dynamic' overrides")
    desc_act = _field(quant_config, "desc_act", default=False)
    sym = _field(quant_config, "sym", default=True)
    if not isinstance(desc_act, bool) or not isinstance(sym, bool):
        raise _refuse(method, f"desc_act={desc_act!r}, sym={sym!r}")
    group_size = _group_size(method, quant_config, True)
    return Int4CheckpointFormat(method, group_size, desc_act, checkpoint_format == "gptq", sym)
