"""The bytes a weight tensor takes once loaded, per storage format and device (no torch: `pagedserve plan`
and the engine's memory accounting call the same functions).

Packed formats are ggml rows (uint8 [rows, row_bytes]): a GGUF file's quantized tensors, online int8/int4
(Q8_0 / Q4_1) and GPTQ/AWQ groups (Q4_0 rows, plus a float32 offset per group when some zero point is not
the symmetric 8). On CPU the native kernels keep every type in NATIVE_GGML_TYPES as rows (F16/F32 too) and
dequantize the others to F32 rows; on CUDA the Triton kernels keep CUDA_PACKED_GGML_TYPES as rows, F16/F32
tensors become floats in the model's dtype, and any other type is refused at startup.
"""

from pagedserve.errors import ConfigError

# ggml type ids (gguf.GGMLQuantizationType) the native CPU kernels compute on directly.
NATIVE_GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
GGML_TYPE_NAMES = {type_id: name for name, type_id in NATIVE_GGML_TYPES.items()}
# ggml type id -> (weights, bytes) per block, as `block_format` in gguf_matmul.cpp.
GGML_BLOCK_FORMATS = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    8: (32, 34),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    39: (32, 17),  # MXFP4: kept by the experts layer (quantization/mxfp4.py), never a linear layer's rows
}
MXFP4_GGML_TYPE = 39
GGML_TYPE_NAMES[MXFP4_GGML_TYPE] = "MXFP4"
# The quantized types with a Triton kernel: what stays packed on CUDA (kernels/triton GGML_TRITON_TYPES).
CUDA_PACKED_GGML_TYPES = frozenset({2, 3, 8, 12, 13, 14, 39})
_FLOAT_GGML_TYPES = frozenset({0, 1})
_F32 = NATIVE_GGML_TYPES["F32"]
_Q4_0 = NATIVE_GGML_TYPES["Q4_0"]


def ggml_bytes(ggml_type: int, num_weights: int) -> int:
    """Bytes of `num_weights` weights in whole ggml blocks of `ggml_type` (one of GGML_BLOCK_FORMATS)."""
    weights, nbytes = GGML_BLOCK_FORMATS[ggml_type]
    return -(-num_weights // weights) * nbytes


def resident_ggml_bytes(
    ggml_type: int, num_weights: int, device: str, float_bytes: int, name: str = ""
) -> int:
    """Bytes a GGUF matrix (or stack of expert matrices) of `ggml_type` takes on `device` once loaded
    (`float_bytes`: the model dtype's size). Raises ConfigError for a type the device has no kernel for,
    naming the tensor, the type and the device."""
    if ggml_type == MXFP4_GGML_TYPE:
        weights, nbytes = MXFP4_BLOCK
        return -(-num_weights // weights) * nbytes
    if device == "cpu":
        held = ggml_type if ggml_type in GGML_BLOCK_FORMATS else _F32
        return ggml_bytes(held, num_weights)
    if ggml_type in CUDA_PACKED_GGML_TYPES:
        return ggml_bytes(ggml_type, num_weights)
    if ggml_type in _FLOAT_GGML_TYPES:
        return num_weights * float_bytes
    raise ConfigError(
        f"GGUF tensor {name or '?'} is of ggml type {ggml_type}, which has no kernel on {device} (packed "
        f"there: {sorted(CUDA_PACKED_GGML_TYPES)}, float: F16/F32); use --device cpu, or a file "
        "quantized with one of those types."
    )


def int4_group_bytes(rows: int, cols: int, group_size: int, symmetric: bool) -> int:
    """A GPTQ/AWQ matrix [rows, cols] once loaded: Q4_0 rows, and unless `symmetric` a float32 offset per
    group of `group_size` columns (-1: one group per row)."""
    groups = 1 if group_size == -1 else -(-cols // group_size)
    return rows * ggml_bytes(_Q4_0, cols) + (0 if symmetric else 4 * rows * groups)


def fp8_matrix_bytes(rows: int, cols: int, scale_block_k: int | None) -> int:
    """An fp8 matrix [rows, cols] once loaded: a byte per weight and a float32 scale per row (and, block-wise,
    per `scale_block_k` columns), as quantization/fp8.py keeps them."""
    blocks = 1 if scale_block_k is None else -(-cols // scale_block_k)
    return rows * cols + 4 * rows * blocks


# MXFP4 (OCP microscaling): 32 E2M1 weights in 16 bytes and one E8M0 scale byte: 4.25 bits a weight.
MXFP4_BLOCK = GGML_BLOCK_FORMATS[MXFP4_GGML_TYPE]


def mxfp4_matrix_bytes(rows: int, cols: int) -> int:
    """An MXFP4 matrix [rows, cols] as quantization/mxfp4.py keeps it: the checkpoint's blocks and scales."""
    weights, nbytes = MXFP4_BLOCK
    return rows * -(-cols // weights) * nbytes


def online_quant_bytes(ggml_type: int, rows: int, cols: int, float_bytes: int) -> int:
    """A float matrix quantized at load (--quantization int8: Q8_0, int4: Q4_1): its ggml rows, or floats
    when its rows do not fill whole groups of 32 (quantization/rtn.py leaves those)."""
    block = GGML_BLOCK_FORMATS[ggml_type][0]
    return rows * ggml_bytes(ggml_type, cols) if cols % block == 0 else rows * cols * float_bytes
