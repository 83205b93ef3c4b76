"""STAND-IN for the pure-torch reference of ggml blocks (another worktree writes the real one): the same
API, dequantizing with gguf-py."""

import torch


def dequantize_ggml_rows(rows: torch.Tensor, ggml_type: int, cols: int) -> torch.Tensor:
    """rows uint8 [R, row_bytes] of `ggml_type` blocks -> float32 [R, cols] on rows' device."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    values = dequantize(rows.cpu().numpy(), GGMLQuantizationType(ggml_type)).reshape(rows.shape[0], cols)
    return torch.from_numpy(values).to(rows.device)
