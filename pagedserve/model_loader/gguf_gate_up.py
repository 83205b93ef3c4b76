"""gpt-oss's experts in a GGUF file, back in HF's layout. HF fuses each layer's expert gate and up into one
`gate_up_proj`, interleaved by rows (gate at even, up at odd); llama.cpp's converter splits them into
`ffn_gate_exps` and `ffn_up_exps` (biases alike) and stores MXFP4 experts in ggml's block layout. Here the
halves are joined again and ggml's MXFP4 blocks become HF's `*_blocks` and `*_scales`: kept packed
(4.25 bits a weight, quantization/mxfp4.py) or widened to float32 for a dequantized load.

ggml's MXFP4 block is 17 bytes: the E8M0 scale, then 16 bytes whose low nibbles are values 0-15 and high
nibbles values 16-31. HF's is the same scale apart and 16 bytes holding values 2i (low) and 2i+1 (high)."""

import re
from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGMLQuantizationType

from pagedserve.errors import ConfigError
from pagedserve.quantization.mxfp4 import BLOCK, dequantize_mxfp4

_GGML_BLOCK_BYTES = 1 + BLOCK // 2
_EXPERTS = re.compile(r"(.*\.experts)\.(gate_proj|up_proj|down_proj)\.(weight|bias)")


def split_experts_name(name: str) -> tuple[str, str, str] | None:
    """(experts prefix, projection, weight or bias) of an expert tensor's HF name; None for another."""
    match = _EXPERTS.fullmatch(name)
    return None if match is None else (match.group(1), match.group(2), match.group(3))


def hf_mxfp4(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml MXFP4 rows uint8 [..., G * 17] -> HF's (blocks uint8 [..., G, 16], scales uint8 [..., G])."""
    blocks = data.reshape(*data.shape[:-1], -1, _GGML_BLOCK_BYTES)
    scales, quants = blocks[..., 0], blocks[..., 1:]
    values = np.concatenate([quants & 0x0F, quants >> 4], axis=-1)  # the 32 codes in order
    return (values[..., 0::2] | values[..., 1::2] << 4).astype(np.uint8), np.ascontiguousarray(scales)


class GateUpJoiner:
    """Takes a layer's expert tensors (HF names of the split halves), yields HF's tensors: gate waits for
    up. `keep_packed`: MXFP4 stays as blocks and scales, else everything comes as float32."""

    def __init__(self, keep_packed: bool) -> None:
        self.keep_packed = keep_packed
        self.waiting: dict[str, np.ndarray] = {}  # HF name of the gate half -> its tensor

    def add(
        self, name: str, tensor_type: GGMLQuantizationType, data: np.ndarray
    ) -> Iterator[tuple[str, torch.Tensor]]:
        parts = split_experts_name(name)
        assert parts is not None, name
        prefix, projection, kind = parts
        if kind == "weight" and tensor_type not in (GGMLQuantizationType.MXFP4, GGMLQuantizationType.F32):
            raise ConfigError(
                f"GGUF tensor {name} is {tensor_type.name}: gpt-oss experts load from MXFP4 (as llama.cpp's "
                "converter writes them) or F32 only; load the file the converter wrote, before llama-quantize."
            )
        if projection == "down_proj":
            yield from self._hf_tensors(f"{prefix}.down_proj", kind, tensor_type, data)
            return
        gate_name = f"{prefix}.gate_proj.{kind}"
        if projection == "gate_proj":
            self.waiting[gate_name] = data
            return
        gate = self.waiting.pop(gate_name)
        joined = np.stack([gate, data], axis=2).reshape(gate.shape[0], -1, *gate.shape[2:])  # interleaved
        yield from self._hf_tensors(f"{prefix}.gate_up_proj", kind, tensor_type, joined)

    def _hf_tensors(
        self, base: str, kind: str, tensor_type: GGMLQuantizationType, data: np.ndarray
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """[E, rows(, ...)] in HF's names: biases as they are, a weight as blocks and scales or as float32
        [E, cols, rows] (HF's in-memory layout)."""
        if kind == "bias":
            yield f"{base}_bias", torch.from_numpy(np.array(data, dtype=np.float32))
            return
        if tensor_type == GGMLQuantizationType.F32:
            yield base, torch.from_numpy(np.array(data, dtype=np.float32)).transpose(1, 2)
            return
        blocks, scales = (torch.from_numpy(part) for part in hf_mxfp4(data))
        if self.keep_packed:
            yield f"{base}_blocks", blocks
            yield f"{base}_scales", scales
            return
        yield base, dequantize_mxfp4(blocks, scales, torch.float32).transpose(1, 2)

    def check_done(self) -> None:
        if self.waiting:
            raise ConfigError(
                f"GGUF expert gates without their up halves: {', '.join(sorted(self.waiting))}."
            )
