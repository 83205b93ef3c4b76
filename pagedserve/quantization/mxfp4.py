"""`mxfp4`: checkpoints whose experts ship in OCP MXFP4 (config.json `quantization_config.quant_method:
"mxfp4"`, gpt-oss's): each row of an expert matrix in blocks of 32 E2M1 values (4 bits: sign, two exponent
bits, one mantissa bit; two to a byte, the low nibble first) with one E8M0 scale byte a block (2^(s - 127)).
Every other layer (attention, router, embedding, head: the checkpoint's `modules_to_not_convert`) is float.

The experts stay as the checkpoint stores them, 4.25 bits a weight (`*_blocks` uint8 [E, rows, cols / 32,
16], `*_scales` uint8 [E, rows, cols / 32]); a step widens each active expert's matrix to the model's dtype
(a table lookup and an exact power-of-two scaling) just before its matmul. NOTE: torch ops on every
device for now: the native CPU and Triton block kernels (ggml's MXFP4 type) do not take it yet.
"""

from dataclasses import dataclass

import torch
from torch import nn

from pagedserve.quantization.base import QuantizationConfig, QuantizeMethodBase, UnquantizedMethod

BLOCK = 32  # weights per scale
# E2M1's sixteen values, by code: the low three bits are magnitude, the fourth the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E8M0_BIAS = 127


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks uint8 [..., G, 16] and scales uint8 [..., G] -> [..., G * 32] in `dtype` (exact in float32
    and bfloat16 while the scales stay in the dtype's range)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2).long()  # low nibble first
    values = torch.ldexp(table[codes], scales.to(torch.int32)[..., None] - _E8M0_BIAS)
    return values.flatten(-2).to(dtype)


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [..., cols] -> (blocks uint8 [..., cols / 32, 16], scales uint8 [..., cols / 32]): each block
    of 32 scaled by the power of two that brings its largest |value| within E2M1's 6, each value rounded to
    the nearest E2M1 code, two codes a byte (the low nibble first). Makes MXFP4 test checkpoints."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=weight.device)
    groups = torch.unflatten(weight, -1, (-1, BLOCK))
    exponent = torch.ceil(torch.log2(groups.abs().amax(-1) / 6.0)).clamp(min=-126)
    codes = ((groups / torch.exp2(exponent)[..., None])[..., None] - table).abs().argmin(-1)
    blocks = (codes[..., 0::2] | codes[..., 1::2] << 4).to(torch.uint8)
    return blocks, (exponent + _E8M0_BIAS).to(torch.uint8)


def create_mxfp4_experts(
    layer: nn.Module, num_experts: int, hidden_size: int, intermediate: int, loader: object
) -> None:
    """Register w13_blocks/w13_scales (gate rows, then up rows: [E, 2 * intermediate, hidden / 32, ...])
    and w2_blocks/w2_scales ([E, hidden, intermediate / 32, ...]) on the fused experts `layer`, each with
    its shard `loader`."""
    for name, rows, cols in (("w13", 2 * intermediate, hidden_size), ("w2", hidden_size, intermediate)):
        if cols % BLOCK:
            raise ValueError(
                f"an MXFP4 expert matrix needs columns in whole blocks of {BLOCK}, but this rank's has {cols} "
                "(hidden_size, or intermediate_size / --tensor-parallel-size)"
            )
        for part, shape in (("blocks", (cols // BLOCK, BLOCK // 2)), ("scales", (cols // BLOCK,))):
            param = nn.Parameter(
                torch.zeros(num_experts, rows, *shape, dtype=torch.uint8), requires_grad=False
            )
            param.weight_loader = loader  # type: ignore[attr-defined]  # NOTE: read by load_weights
            layer.register_parameter(f"{name}_{part}", param)


def mxfp4_expert_weight(layer: nn.Module, name: str, expert: int, dtype: torch.dtype) -> torch.Tensor:
    """Expert `expert`'s w13 or w2 [rows, cols], widened from the layer's MXFP4 blocks."""
    blocks, scales = getattr(layer, f"{name}_blocks")[expert], getattr(layer, f"{name}_scales")[expert]
    return dequantize_mxfp4(blocks, scales, dtype)


@dataclass(frozen=True)
class Mxfp4Config(QuantizationConfig):
    """Linear layers float; fused experts in MXFP4 (layers/moe.py asks `packed_experts`)."""

    name = "mxfp4"
    packed_experts = "mxfp4"

    def get_linear_method(self) -> QuantizeMethodBase:
        return UnquantizedMethod()
