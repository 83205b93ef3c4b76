"""STAND-IN for the Triton kernels of ggml blocks (another worktree writes the real ones): the same API,
dequantizing with gguf-py then multiplying with torch, so the backend wiring can be built and tested."""

import torch

GGML_TRITON_TYPES: frozenset[int] = frozenset({2, 3, 8, 12, 13, 14})


def ggml_dequantize(rows: torch.Tensor, ggml_type: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """rows uint8 [R, row_bytes] of `ggml_type` blocks -> [R, cols] in `dtype`."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    values = dequantize(rows.cpu().numpy(), GGMLQuantizationType(ggml_type)).reshape(rows.shape[0], cols)
    return torch.from_numpy(values).to(device=rows.device, dtype=dtype)


def ggml_matmul(x: torch.Tensor, rows: torch.Tensor, ggml_type: int, out_features: int) -> torch.Tensor:
    """x [B, K] times the [out_features, K] weight in `rows` -> [B, out_features] in x.dtype."""
    weight = ggml_dequantize(rows, ggml_type, x.shape[1], x.dtype)
    assert weight.shape[0] == out_features
    return (x.unsqueeze(1) * weight).sum(dim=-1)  # each row on its own, as a Triton tile computes it
