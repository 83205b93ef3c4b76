"""`int8` / `int4`: online weight-only quantization of any float checkpoint, group-wise round-to-nearest.

Groups of 32 weights along a row, stored as ggml blocks so the GGUF kernels compute on them: int8 as
Q8_0 (symmetric, one fp16 scale per group), int4 as Q4_1 (asymmetric, fp16 scale and minimum per group).
NOTE: why not torch's `_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu`: the int8 one has one scale per
output channel (not group-wise), and the int4 one multiplies float32 activations far slower than our
kernel (benchmarks/quant_kernels.py); one kernel for GGUF files and online schemes keeps one code path.
"""

from typing import cast

import torch
from torch import nn

from pagedserve.quantization.base import QuantizationConfig, QuantizeMethodBase, UnquantizedMethod
from pagedserve.quantization.gguf import GGUFMethod, GGUFPart

GROUP_SIZE = 32
GGML_Q4_1, GGML_Q8_0 = 3, 8


def _half_bytes(values: torch.Tensor) -> torch.Tensor:
    """[groups] float -> [groups, 2] uint8, the fp16 bit pattern (little-endian, as ggml stores it)."""
    return values.to(torch.float16).view(torch.uint8).reshape(-1, 2)


def quantize_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] float -> [N, K / 32 * 34] uint8 Q8_0 rows: per group d = max|w| / 127, q = round(w / d)."""
    rows = weight.shape[0]
    groups = weight.float().reshape(-1, GROUP_SIZE)
    scale = (groups.abs().amax(dim=1) / 127).to(torch.float16).float()
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    q = torch.round(groups * inverse[:, None]).clamp(-127, 127).to(torch.int8)
    return torch.cat([_half_bytes(scale), q.view(torch.uint8)], dim=1).reshape(rows, -1)


def quantize_q4_1(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] float -> [N, K / 32 * 20] uint8 Q4_1 rows: per group d = (max - min) / 15, m = min,
    q = round((w - m) / d) in [0, 15]; byte j holds q[j] (low nibble) and q[j + 16] (high)."""
    rows = weight.shape[0]
    groups = weight.float().reshape(-1, GROUP_SIZE)
    low = groups.amin(dim=1).to(torch.float16).float()
    scale = ((groups.amax(dim=1) - low) / 15).to(torch.float16).float()
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    q = torch.round((groups - low[:, None]) * inverse[:, None]).clamp(0, 15).to(torch.uint8)
    return q4_block_rows(q, scale, low).reshape(rows, -1)


def q4_block_rows(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None) -> torch.Tensor:
    """Blocks of 32 4-bit values q [blocks, 32] (uint8 in [0, 15]) with one scale d per block, as ggml
    stores them: Q4_1 (value = d * q + minimum) when `minimum` is given, else Q4_0 (value = d * (q - 8)).
    d and minimum are rounded to fp16; byte j of a block holds q[j] (low nibble) and q[j + 16] (high).
    Returns uint8 [blocks, 20] (Q4_1) or [blocks, 18] (Q4_0)."""
    packed = q[:, :16] | (q[:, 16:] << 4)
    halves = [_half_bytes(scale)] + ([] if minimum is None else [_half_bytes(minimum)])
    return torch.cat([*halves, packed], dim=1)


class RTNMethod(GGUFMethod):
    """Loads the float weight as an unquantized layer does, then quantizes it once loaded."""

    def __init__(self, ggml_type: int) -> None:
        super().__init__()
        self.ggml_type = ggml_type

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        self.cols, self.output_size = input_size, output_size
        UnquantizedMethod().create_weights(layer, input_size, output_size)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.cols % GROUP_SIZE:
            return  # NOTE: rows that do not fill whole groups stay in float (rare: odd projection sizes)
        quantize = quantize_q8_0 if self.ggml_type == GGML_Q8_0 else quantize_q4_1
        rows = quantize(cast(torch.Tensor, layer.weight).data)
        del layer.weight
        part = GGUFPart(self.ggml_type, 0, self.output_size, rows, backend=self.backend)
        part = part.packed_for_integers(self.activation_bits)
        layer.qweight = nn.Parameter(part.rows, requires_grad=False)
        self.parts = [part]

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not self.parts:
            return UnquantizedMethod().apply(layer, x)
        return super().apply(layer, x)


class Int8Config(QuantizationConfig):
    """--quantization int8: linear layers to 8 bits (groups of 32); embeddings and LM head stay float."""

    name = "int8"

    def get_linear_method(self) -> QuantizeMethodBase:
        return RTNMethod(GGML_Q8_0)


class Int4Config(QuantizationConfig):
    """--quantization int4: linear layers to 4 bits (groups of 32, with a minimum); embeddings and LM head
    stay float."""

    name = "int4"

    def get_linear_method(self) -> QuantizeMethodBase:
        return RTNMethod(GGML_Q4_1)
