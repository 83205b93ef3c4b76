"""`mxfp4`: checkpoints whose experts ship in OCP MXFP4 (config.json `quantization_config.quant_method:
"mxfp4"`, gpt-oss's): each row of an expert matrix in blocks of 32 E2M1 values (4 bits: sign, two exponent
bits, one mantissa bit; two to a byte, the low nibble first) with one E8M0 scale byte a block (2^(s - 127)).
Every other layer (attention, router, embedding, head: the checkpoint's `modules_to_not_convert`) is float.

The experts load as the checkpoint stores them, 4.25 bits a weight (`*_blocks` uint8 [E, rows, cols / 32,
16], `*_scales` uint8 [E, rows, cols / 32]). Then, by --linear-backend (`Mxfp4ExpertsMethod`):
- native, triton: each matrix becomes ggml's MXFP4 rows (`*_rows` uint8 [E, rows, cols / 32 * 17]), the
  block type of the native CPU and Triton block kernels. Doubled, E2M1 values are integers (up to 12) and
  the scales powers of two, so the kernels' integer dots on the weights are exact: only the activations'
  rounding (PAGEDSERVE_GGUF_ACTIVATION_BITS, as GGUF layers) differs from the widened reference.
- torch: a step widens each active expert's matrix to the model's dtype (a table lookup and an exact
  power-of-two scaling) just before its matmul: the reference, on any device.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve import envs
from pagedserve.config.weight_bytes import MXFP4_GGML_TYPE
from pagedserve.kernels.cpu.gguf_ops import DECODE_MAX_BATCH, gguf_matmul
from pagedserve.quantization.base import QuantizationConfig, QuantizeMethodBase, UnquantizedMethod, linear
from pagedserve.quantization.ggml_backend import ggml_linear

BLOCK = 32  # weights per scale
# E2M1's sixteen values, by code: the low three bits are magnitude, the fourth the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E8M0_BIAS = 127
# The native decode kernel sums each row's blocks in one accumulator chain for 3 to DECODE_MAX_BATCH rows a
# call (1 and 2 rows split them over two chains, more rows take the float GEMM): calls of that many rows give
# a row the same bits whatever shares its step, as the engine's row-invariant matmuls do.
_ONE_CHAIN_ROWS = 3


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


def ggml_mxfp4_rows(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """HF's blocks uint8 [..., G, 16] and scales uint8 [..., G] -> ggml's MXFP4 rows uint8 [..., G * 17]:
    per block the scale byte, then 16 bytes holding weight l in the low nibble of byte l and weight l + 16
    in the high one (Q4_0's nibble order, which the block kernels unpack)."""
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # the 32 codes in order
    quants = codes[..., : BLOCK // 2] | codes[..., BLOCK // 2 :] << 4
    return torch.cat([scales[..., None], quants], dim=-1).flatten(-2)


class Mxfp4ExpertsMethod(QuantizeMethodBase):
    """A fused experts layer's MXFP4 matrices (w13, w2) on `backend` (--linear-backend, resolved): native
    and triton multiply ggml MXFP4 rows with the block kernels, torch widens each expert per call."""

    def __init__(self, backend: str, num_experts: int) -> None:
        self.backend, self.num_experts = backend, num_experts
        self.activation_bits = envs.gguf_activation_bits()

    @property
    def packed(self) -> bool:
        return self.backend != "torch"

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        """input_size: hidden; output_size: the per-rank intermediate size (`create_mxfp4_experts`)."""
        create_mxfp4_experts(layer, self.num_experts, input_size, output_size, layer.weight_loader)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            "an experts layer multiplies one expert at a time: Mxfp4ExpertsMethod.project"
        )

    def project(self, layer: nn.Module, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
        """x [T, cols] times expert `expert`'s w13 or w2 [rows, cols] transposed, in x's dtype."""
        if not self.packed:
            blocks, scales = (
                getattr(layer, f"{name}_blocks")[expert],
                getattr(layer, f"{name}_scales")[expert],
            )
            return linear(x, dequantize_mxfp4(blocks, scales, x.dtype))
        rows = getattr(layer, f"{name}_rows")[expert]
        if self.backend == "native":
            return self._native_row_invariant(x.float(), rows).to(x.dtype)
        return ggml_linear(self.backend, x, rows, MXFP4_GGML_TYPE, self.activation_bits).to(x.dtype)

    def _native_row_invariant(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """x [T, cols] float32 through the decode kernel in calls of _ONE_CHAIN_ROWS..DECODE_MAX_BATCH rows
        (zero rows pad a short one). NOTE: a prefill reads the weights once per 8 rows; a row-invariant
        packed MXFP4 kernel (as Q4_0's) would read them once."""
        parts = []
        for chunk in torch.split(x, DECODE_MAX_BATCH):
            padded = F.pad(chunk, (0, 0, 0, max(0, _ONE_CHAIN_ROWS - chunk.shape[0])))
            parts.append(gguf_matmul(padded, rows, MXFP4_GGML_TYPE, self.activation_bits)[: chunk.shape[0]])
        return torch.cat(parts) if parts else x.new_empty(0, rows.shape[0])

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """native, triton: the checkpoint's blocks and scales become ggml rows (the same 4.25 bits)."""
        if not self.packed:
            return
        for name in ("w13", "w2"):
            blocks, scales = getattr(layer, f"{name}_blocks"), getattr(layer, f"{name}_scales")
            rows = ggml_mxfp4_rows(blocks.data, scales.data)
            delattr(layer, f"{name}_blocks")
            delattr(layer, f"{name}_scales")
            layer.register_parameter(f"{name}_rows", nn.Parameter(rows, requires_grad=False))

    def storage_formats(self, layer: nn.Module) -> set[str]:
        floats = {
            str(p.dtype).removeprefix("torch.")
            for p in layer.parameters(recurse=False)
            if p.is_floating_point()
        }
        experts = (
            f"mxfp4 packed, {self.backend} block kernels" if self.packed else "mxfp4 widened per step (torch)"
        )
        return floats | {experts}


@dataclass(frozen=True)
class Mxfp4Config(QuantizationConfig):
    """Linear layers float; fused experts in MXFP4 (layers/moe.py asks `packed_experts`)."""

    name = "mxfp4"
    packed_experts = "mxfp4"

    def get_linear_method(self) -> QuantizeMethodBase:
        return UnquantizedMethod()
