"""`fp8`: checkpoints that ship fp8 weights (config.json `quantization_config.quant_method: "fp8"`, as
vLLM and transformers' FineGrainedFP8 / llm-compressor write them): each linear weight in float8_e4m3fn
with float32 scales, per tensor or per output channel (`weight_scale`, weight = fp8 * scale) or per
[block_n x block_k] block (`weight_scale_inv` with `weight_block_size`), and for static W8A8 an
activation scale per layer (`input_scale`).

CPU: weight-only. The fp8 bytes stay resident (1 byte per weight); every matmul widens them to float32
as it reads them (in vector registers at decode batch sizes, into float32 tiles for ATen's GEMM above
them) and computes in float32 (kernels/cpu/fp8_matmul.cpp, with vec_fp8.h's fp8 codec). NOTE: why a
kernel: torch's fp8 -> float32 conversion of a weight costs ~100x the float32 matmul it feeds on this CPU
(benchmarks/quant_kernels.py: "torch fp8 upcast"). CUDA: W8A8 with torch._scaled_mm (activations
quantized per token) where it applies, else the same dequantize-and-matmul.

`ignored_layers` (vLLM's name; llm-compressor writes `ignore`, transformers `modules_to_not_convert`):
module names or `re:` regexes (matched from the start) of layers the checkpoint leaves in float; they load
as plain float weights. A fused layer (qkv_proj, gate_up_proj) is float when all its checkpoint parts are
named, and refused when only some are (one matmul cannot mix the two).

Scales are kept per row, [N, ceil(K / block_k)] (per-tensor and per-channel: one column), so fused
layers (qkv, gate_up) whose parts have their own per-tensor scales keep each part's scale, and the
layers' own shard loaders place them as they place the weight's rows.
"""

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.errors import ConfigError
from pagedserve.quantization.base import QuantizationConfig, QuantizeMethodBase, UnquantizedMethod

WeightLoader = Callable[[nn.Parameter, torch.Tensor, object], object]  # a layer's shard loader
MAX_BLOCK = 1 << 16  # weight_block_size bound (checkpoints use 128)
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
IGNORED_LAYERS_KEYS = ("ignored_layers", "ignore", "modules_to_not_convert")  # vLLM's, llm-compressor's, HF's
_CHUNK_ELEMENTS = 1 << 22  # the fallback's float32 staging: 16 MiB of a weight at a time
_FP8_VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()


@dataclass(frozen=True)
class Fp8Config(QuantizationConfig):
    activation_scheme: str = "dynamic"  # static: the checkpoint ships each layer's input_scale
    weight_block_size: tuple[int, int] | None = None  # (block_n, block_k): block-wise scales
    ignored_layers: tuple[str, ...] = ()  # names or "re:" regexes of the layers kept in float

    name = "fp8"

    @classmethod
    def from_checkpoint(cls, quant_config: dict[str, object]) -> "Fp8Config":
        scheme = quant_config.get("activation_scheme", "dynamic")
        if scheme not in ("dynamic", "static"):
            raise ConfigError(
                f"fp8 checkpoint: quantization_config.activation_scheme is {scheme!r}; "
                "supported: dynamic, static."
            )
        block = quant_config.get("weight_block_size")
        if block is not None and not (
            isinstance(block, list | tuple)
            and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= MAX_BLOCK for b in block)
        ):
            raise ConfigError(
                f"fp8 checkpoint: quantization_config.weight_block_size is {block!r}; it must be two "
                f"integers [block_n, block_k] in [1, {MAX_BLOCK}] (e.g. [128, 128]) or absent."
            )
        fmt = quant_config.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ConfigError(f"fp8 checkpoint: quantization_config.fmt is {fmt!r}; supported: e4m3.")
        block_size = None if block is None else (int(block[0]), int(block[1]))
        return cls(str(scheme), block_size, _ignored_layers(quant_config))

    def get_linear_method(self) -> QuantizeMethodBase:
        return Fp8LinearMethod(self)

    def prepare_layers(self, model: nn.Module) -> None:
        """The ignored layers become plain float layers before the checkpoint loads."""
        if not self.ignored_layers:
            return
        # our fused layer -> the checkpoint's parts (e.g. qkv_proj -> q_proj, k_proj, v_proj)
        fused_parts: dict[str, list[str]] = {}
        for part, (fused, _) in getattr(model, "stacked_params", {}).items():
            fused_parts.setdefault(fused, []).append(part)
        for name, module in model.named_modules():
            if isinstance(getattr(module, "quant_method", None), Fp8LinearMethod) and self._is_ignored(
                name, fused_parts
            ):
                _keep_in_float(module)

    def _is_ignored(self, name: str, fused_parts: dict[str, list[str]]) -> bool:
        prefix, _, short = name.rpartition(".")
        parts = [f"{prefix}.{part}" if prefix else part for part in fused_parts.get(short, [])]
        named = [part for part in parts if self._matches(part)]
        if named and len(named) < len(parts):
            raise ConfigError(
                f"fp8 checkpoint: quantization_config's ignored layers name {', '.join(named)} but not "
                f"{', '.join(p for p in parts if p not in named)}, which pagedserve fuses with them into "
                f"{name}; the parts of a fused layer must all be quantized or all be listed."
            )
        return bool(named) or self._matches(name)

    def _matches(self, name: str) -> bool:
        return any(
            re.match(entry[3:], name) if entry.startswith("re:") else entry == name
            for entry in self.ignored_layers
        )


def _ignored_layers(quant_config: dict[str, object]) -> tuple[str, ...]:
    """The checkpoint's list of layers left in float, validated (regexes compiled)."""
    key = next((key for key in IGNORED_LAYERS_KEYS if quant_config.get(key) is not None), None)
    if key is None:
        return ()
    entries = quant_config[key]
    if not isinstance(entries, list | tuple) or not all(isinstance(e, str) and e for e in entries):
        raise ConfigError(
            f"fp8 checkpoint: quantization_config.{key} is {entries!r}; it must be a list of module "
            'names or "re:" regexes (e.g. ["lm_head", "re:.*mlp.gate$"]).'
        )
    for entry in entries:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as exc:
                raise ConfigError(
                    f"fp8 checkpoint: quantization_config.{key} holds {entry!r}, not a valid regex: {exc}."
                ) from exc
    return tuple(entries)


def _keep_in_float(layer: nn.Module) -> None:
    """Replace a layer's fp8 parameters (not loaded yet) by a float weight of the same shape."""
    method = cast(Fp8LinearMethod, layer.quant_method)
    output_size, input_size = cast(torch.Tensor, layer.weight).shape
    for name in ("weight", method.scale_name, "input_scale"):
        if hasattr(layer, name):
            delattr(layer, name)
    float_method = UnquantizedMethod()
    float_method.create_weights(layer, input_size, output_size)
    layer.quant_method = float_method  # type: ignore[assignment]  # NOTE: nn.Module types attributes as tensors or modules


class Fp8LinearMethod(QuantizeMethodBase):
    def __init__(self, config: Fp8Config) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        block = self.config.weight_block_size
        self.block_n, self.block_k = block if block else (output_size, input_size)
        self.scale_name = "weight_scale_inv" if block else "weight_scale"
        weight = torch.empty(output_size, input_size, dtype=torch.float8_e4m3fn)
        layer.weight = nn.Parameter(weight, requires_grad=False)
        layer.weight.weight_loader = layer.weight_loader  # type: ignore[attr-defined]
        scale_columns = -(-input_size // self.block_k)
        scale = nn.Parameter(
            torch.empty(output_size, scale_columns, dtype=torch.float32), requires_grad=False
        )
        scale.weight_loader = functools.partial(self._load_scale, layer)  # type: ignore[attr-defined]
        layer.register_parameter(self.scale_name, scale)
        if self.config.activation_scheme == "static":
            # NOTE: one scale for a fused layer's parts: the largest (no part's activations saturate).
            input_scale = nn.Parameter(torch.zeros((), dtype=torch.float32), requires_grad=False)
            input_scale.weight_loader = _load_max  # type: ignore[attr-defined]
            layer.input_scale = input_scale

    def _load_scale(
        self, layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor, shard_id: object
    ) -> None:
        """The checkpoint's scales of one part, expanded to one row per weight row, then placed by the
        layer's own loader (its shard of the rows, or of the column blocks in a row-parallel layer)."""
        scales = torch.as_tensor(torch.atleast_2d(loaded), dtype=torch.float32)
        if scales.numel() == 1:  # per tensor: the same scale for every row this part may have
            scales = scales.reshape(1, 1).expand(param.shape[0] * getattr(layer, "tp_size", 1), 1)
        elif self.config.weight_block_size:  # per block: each block row's scales for its block_n rows
            scales = scales.repeat_interleave(self.block_n, dim=0)
        else:  # per channel: [N] or [N, 1]
            scales = scales.reshape(-1, 1)
        # NOTE: a row-parallel layer (it splits the input) holds every output row: its scale rows whole.
        if hasattr(layer, "input_size_per_partition"):
            scales = scales[: param.shape[0]]
            if param.shape[1] == 1:
                param.data.copy_(scales)
                return
        cast(WeightLoader, layer.weight_loader)(param, scales, shard_id)

    def dequantized_weight(self, layer: nn.Module, rows: slice = slice(None)) -> torch.Tensor:
        """Rows of the weight in float32: fp8 value * its scale (block-wise: its block's)."""
        weight = cast(torch.Tensor, layer.weight)[rows]
        scales = cast(torch.Tensor, getattr(layer, self.scale_name))[rows]
        columns = scales.repeat_interleave(self.block_k, dim=1)[:, : weight.shape[1]]
        return _FP8_VALUES.to(weight.device)[weight.view(torch.uint8).long()] * columns

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        weight = cast(torch.Tensor, layer.weight)
        scales = cast(torch.Tensor, getattr(layer, self.scale_name))
        flat = x.reshape(-1, x.shape[-1])
        if x.is_cuda and self.config.weight_block_size is None and _scaled_mm_fits(weight):
            out = _scaled_mm_w8a8(flat, weight, scales, getattr(layer, "input_scale", None))
        elif x.device.type == "cpu" and _native_kernels():
            from pagedserve.kernels.cpu.fp8_ops import fp8_matmul

            out = fp8_matmul(flat.float(), weight.view(torch.uint8), scales, self.block_k)
        else:
            out = torch.cat(
                [
                    F.linear(flat.float(), self.dequantized_weight(layer, slice(start, start + step)))
                    for start, step in _row_chunks(weight.shape)
                ],
                dim=-1,
            )
        return out.to(x.dtype).reshape(*x.shape[:-1], -1)


def _load_max(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    param.data.copy_(torch.maximum(param.data, torch.reshape(loaded, ()).float()))


def _row_chunks(shape: torch.Size) -> list[tuple[int, int]]:
    step = max(1, _CHUNK_ELEMENTS // max(1, shape[1]))
    return [(start, min(step, shape[0] - start)) for start in range(0, shape[0], step)]


def _native_kernels() -> bool:
    from pagedserve.kernels.cpu import load_cpu_kernels

    return load_cpu_kernels().module is not None


def _scaled_mm_fits(weight: torch.Tensor) -> bool:
    """torch._scaled_mm exists and takes this weight (both dimensions multiples of 16)."""
    return hasattr(torch, "_scaled_mm") and weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0


def _scaled_mm_w8a8(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, input_scale: torch.Tensor | None
) -> torch.Tensor:
    """CUDA (compute capability 8.9+): fp8 x fp8 with float32 accumulation, row-wise scales: activations
    per token (dynamic) or the checkpoint's input_scale (static), weights per output row."""
    if input_scale is None:
        x_scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    else:
        x_scale = input_scale.reshape(1, 1).expand(x.shape[0], 1).contiguous()
    x_fp8 = (x.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return torch._scaled_mm(
        x_fp8, weight.t(), scale_a=x_scale, scale_b=scales.reshape(1, -1), out_dtype=torch.bfloat16
    )
