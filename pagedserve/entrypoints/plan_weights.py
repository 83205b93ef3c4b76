"""The weight bytes `pagedserve plan` counts per rank, as the engine holds them on the device it plans for:
every parameter in the model's dtype, except the linear layers of a quantized checkpoint (GPTQ/AWQ: Q4_0 rows
and group offsets; fp8: a byte per weight and float32 scales; MXFP4 experts: 4.25 bits a weight) and a
GGUF file's tensors, counted tensor by tensor from the file's header (no data read). The per-format bytes
come from config/weight_bytes.py, which the engine shares."""

import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from pagedserve.config import ModelConfig
from pagedserve.config.int4_checkpoint import parse_int4_checkpoint
from pagedserve.config.parallel import PipelineStage
from pagedserve.config.quantization import checkpoint_quantization_config
from pagedserve.config.weight_bytes import (
    CUDA_PACKED_GGML_TYPES,
    GGML_BLOCK_FORMATS,
    GGML_TYPE_NAMES,
    fp8_matrix_bytes,
    int4_group_bytes,
    mxfp4_matrix_bytes,
    online_quant_bytes,
    resident_ggml_bytes,
)
from pagedserve.model_shape import ModelShape
from pagedserve.sizing import WeightBytes
from pagedserve.utils.gguf_tensors import read_gguf

_GGUF_LAYER = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class LinearStorage:
    """How the linear layers (attention projections, dense MLPs) of a quantized model are held."""

    method: str  # gptq | awq (4-bit groups), fp8, int8 | int4 (online: Q8_0 / Q4_1 rows), mxfp4 (experts)
    group_size: int = -1  # 4-bit groups: columns per group (-1: one per row)
    symmetric: bool = True  # 4-bit groups: no float32 offsets
    scale_block_k: int | None = None  # fp8 block-wise: columns per scale (None: one scale per row)

    def matrix_bytes(self, rows: int, cols: int, float_bytes: int) -> int:
        if self.method == "fp8":
            return fp8_matrix_bytes(rows, cols, self.scale_block_k)
        if self.method in ("int8", "int4"):
            return online_quant_bytes(8 if self.method == "int8" else 3, rows, cols, float_bytes)
        return int4_group_bytes(rows, cols, self.group_size, self.symmetric)


def linear_storage(model_config: ModelConfig) -> LinearStorage | None:
    """The checkpoint's linear layers' storage; None when they are in the model's dtype. NOTE: fp8 layers
    a checkpoint leaves in float (`ignored_layers`) are counted as fp8 (config.json has no shapes by name;
    the usual entry, lm_head, is not a linear layer here)."""
    method = model_config.quantization
    if method in ("gptq", "awq"):
        layout = parse_int4_checkpoint(method, checkpoint_quantization_config(model_config))
        return LinearStorage(method, layout.group_size, layout.sym)
    if method == "mxfp4":
        return LinearStorage("mxfp4")
    if method == "fp8":
        block = checkpoint_quantization_config(model_config).get("weight_block_size")
        block_k = int(block[1]) if isinstance(block, list | tuple) and len(block) == 2 else None
        return LinearStorage("fp8", scale_block_k=block_k)
    return None


def weights_bytes(shape: ModelShape, tp: int, dtype_bytes: int, storage: LinearStorage | None) -> WeightBytes:
    """One rank's weights: those outside the decoder layers, and each layer's."""
    layers = tuple(_layer_bytes(shape, tp, index, dtype_bytes, storage) for index in shape.layer_indices)
    outside = shape.num_parameters(tp) - sum(
        shape.layer_parameters(tp, index) for index in shape.layer_indices
    )
    return WeightBytes(outside * dtype_bytes, layers)


def _layer_bytes(
    shape: ModelShape, tp: int, index: int, dtype_bytes: int, storage: LinearStorage | None
) -> int:
    nbytes = shape.layer_parameters(tp, index) * dtype_bytes
    if storage is None:
        return nbytes
    if storage.method == "mxfp4":  # the experts alone: attention and router stay in the model's dtype
        for rows, cols in shape.expert_matrices(tp, index):
            nbytes += mxfp4_matrix_bytes(rows, cols) - rows * cols * dtype_bytes
        return nbytes
    for rows, cols in shape.linear_matrices(tp, index):
        nbytes += storage.matrix_bytes(rows, cols, dtype_bytes) - rows * cols * dtype_bytes
    return nbytes


@functools.cache  # NOTE: "what would fit" asks again per --cpu-offload-gb and --tensor-parallel-size tried
def gguf_weights_bytes(
    path: str, tp: int, stage: PipelineStage, device: str, dtype_bytes: int
) -> WeightBytes:
    """One rank's weights of a GGUF file on `device`, tensor by tensor from its header: matrices (and
    stacked experts) in their resident format, split over the `tp` ranks; vectors (norms, biases) in the
    model's dtype, on every rank. Raises ConfigError for a type the device refuses."""
    outside, layers = 0, [0] * (stage.end - stage.start)
    for name, dims, ggml_type in _gguf_tensors(path):
        count = 1
        for dim in dims:
            count *= dim
        if len(dims) == 1:
            nbytes = count * dtype_bytes
        else:
            nbytes = resident_ggml_bytes(ggml_type, count, device, dtype_bytes, name) // tp
        match = _GGUF_LAYER.match(name)
        if match is None:
            head = name.startswith("output")
            outside += nbytes if (stage.is_last if head else stage.is_first) else 0
        elif stage.holds(int(match.group(1))):
            layers[int(match.group(1)) - stage.start] += nbytes
    return WeightBytes(outside, tuple(layers))


def mmproj_weights_bytes(path: str, dtype_bytes: int) -> int:
    """The mmproj GGUF's vision tower and projector (--mmproj): held in the model's dtype on every rank
    (model_loader/gguf_mmproj.py dequantizes them), with the first stage's weights."""
    return sum(math.prod(dims) * dtype_bytes for _, dims, _ in _gguf_tensors(path))


def gguf_types(path: str, device: str) -> tuple[list[str], list[str]]:
    """The ggml type names of the file's matrices that stay packed on `device`, and of those held as
    floats (vectors are always floats)."""
    packed: set[str] = set()
    floats: set[str] = set()
    for _, dims, ggml_type in _gguf_tensors(path):
        stays = ggml_type in GGML_BLOCK_FORMATS if device == "cpu" else ggml_type in CUDA_PACKED_GGML_TYPES
        (packed if stays and len(dims) > 1 else floats).add(GGML_TYPE_NAMES.get(ggml_type, str(ggml_type)))
    return sorted(packed), sorted(floats)


def _gguf_tensors(path: str) -> Iterator[tuple[str, tuple[int, ...], int]]:
    """(name, dims, ggml type id) of each tensor in the file's header the model loads (llama.cpp's
    precomputed rope frequencies are computed by the model instead)."""
    for tensor in read_gguf(path).tensors:
        if not tensor.name.startswith("rope_"):
            yield tensor.name, tensor.shape, int(tensor.tensor_type)
