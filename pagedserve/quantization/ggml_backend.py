"""--linear-backend: how rows of ggml blocks are multiplied and how embedding rows are read back. Every
quantized scheme stores its weights as such rows (GGUF's own, int8/int4 as Q8_0/Q4_1, GPTQ/AWQ as Q4_0 plus
group offsets), so this is the one seam between the schemes and the kernels:
native: the C++ CPU kernels (`kernels/cpu/gguf_ops.py`); triton: the Triton kernels on the stored blocks
(`kernels/triton/quant_matmul.py`; CUDA, or CPU under TRITON_INTERPRET=1); torch: the rows dequantized with
torch ops at each call, then `base.linear` (the reference, any device). Float rows (F32, F16: a GGUF file's float
tensors) are viewed as floats on every backend but native, whose kernels read them as they are."""

import torch

from pagedserve.errors import ConfigError
from pagedserve.kernels.cpu.gguf_ops import NATIVE_GGML_TYPES, gguf_dequantize, gguf_matmul
from pagedserve.quantization.base import linear, linear_backend

FLOAT_GGML_TYPES = {NATIVE_GGML_TYPES["F32"]: torch.float32, NATIVE_GGML_TYPES["F16"]: torch.float16}


def current_linear_backend() -> str:
    """The backend of the quantized layers being built, checked against the device the model is built
    on (`check_backend`)."""
    backend = linear_backend()
    check_backend(backend, torch.empty(0).device.type)
    return backend


def check_backend(backend: str, device: str) -> None:
    """Raises ConfigError when `backend` cannot run on `device`: native off the CPU, triton on CPU with
    kernels not defined under Triton's interpreter."""
    if backend == "native" and device != "cpu":
        raise ConfigError(
            f"--linear-backend native has CPU kernels only, but the model is built on {device}; use "
            "--linear-backend triton (or torch), or --device cpu."
        )
    if backend == "triton" and device == "cpu":
        from pagedserve.kernels import triton as triton_kernels  # NOTE: see kernel_types

        if not triton_kernels.INTERPRETED:
            raise ConfigError(
                "--linear-backend triton on the CPU runs only in Triton's interpreter: set TRITON_INTERPRET=1 "
                "before pagedserve.kernels.triton is imported (tests only, very slow), or use "
                "--linear-backend native or torch."
            )


def kernel_types(backend: str) -> frozenset[int]:
    """The ggml type ids `backend` multiplies as stored."""
    if backend == "native":
        return frozenset(NATIVE_GGML_TYPES.values())
    # NOTE: imported here: importing the package defines every Triton kernel (interpreted or compiled
    # as TRITON_INTERPRET says at that moment), which the native backend never needs.
    from pagedserve.kernels.triton import GGML_TRITON_TYPES

    return GGML_TRITON_TYPES | frozenset(FLOAT_GGML_TYPES)


def check_kernel(backend: str, ggml_type: int, type_name: str, device: str) -> None:
    """Raises ConfigError when `backend` has no kernel for `ggml_type` (named `type_name`) on `device`:
    such a weight is refused at startup, never dequantized behind the user's back."""
    types = kernel_types(backend)
    if ggml_type not in types:
        supported = [name for name, id_ in NATIVE_GGML_TYPES.items() if id_ in types]
        raise ConfigError(
            f"ggml type {type_name} has no kernel in --linear-backend {backend} on {device} (it has: "
            f"{', '.join(supported)}); use --quantization none to load the weights dequantized, or a file "
            "quantized to one of those types."
        )


def ggml_linear(
    backend: str, x: torch.Tensor, rows: torch.Tensor, ggml_type: int, activation_bits: int = 32
) -> torch.Tensor:
    """x [B, K] times the weight stored in `rows` (uint8 [N, row_bytes]) transposed -> [B, N]: float32
    on native (`activation_bits`: gguf_matmul's), x's dtype on the others."""
    if backend == "native":
        return gguf_matmul(x.float(), rows, ggml_type, activation_bits)
    if backend == "triton" and ggml_type not in FLOAT_GGML_TYPES:
        from pagedserve.kernels.triton import ggml_matmul

        return ggml_matmul(x, rows, ggml_type, rows.shape[0])
    # NOTE: `linear`: on CPU in float32 row-invariant (a token's output the same whatever shares its step),
    # as the native kernels are; these backends run on CPU for tests only, where that is what is checked.
    return linear(x, ggml_dequantize(backend, rows, ggml_type, x.shape[1], x.dtype))


def ggml_dequantize(
    backend: str, rows: torch.Tensor, ggml_type: int, cols: int, dtype: torch.dtype
) -> torch.Tensor:
    """rows uint8 [R, row_bytes] -> their weights [R, cols] in `dtype` (embedding lookups)."""
    if backend == "native":
        return gguf_dequantize(rows, ggml_type, cols).to(dtype)
    if ggml_type in FLOAT_GGML_TYPES:
        return rows.view(FLOAT_GGML_TYPES[ggml_type]).to(dtype)
    if backend == "triton":
        from pagedserve.kernels.triton import ggml_dequantize as triton_dequantize

        return triton_dequantize(rows, ggml_type, cols, dtype)
    from pagedserve.quantization.ggml_torch import dequantize_ggml_rows

    return dequantize_ggml_rows(rows, ggml_type, cols).to(dtype)
