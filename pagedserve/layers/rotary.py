"""Rotary position embeddings (neox layout, as HF Llama/Qwen2/Mistral), with linear and Llama-3 scaling."""
import math
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """rope_theta, rope_type and scaling fields, from transformers 5's `rope_parameters` or the older
    `rope_theta` + `rope_scaling` pair."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    params = {**scaling, **params}
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_type={params['rope_type']!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}.")
    return params


def _inv_freq(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    base = params["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if params["rope_type"] == "linear":
        return inv_freq / params["factor"]
    if params["rope_type"] == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    """Rotates q and k by position; cos/sin are precomputed in float32 for every position. One instance
    serves every layer of a model: the step's cos/sin rows are gathered once, by the first layer."""

    def __init__(self, head_dim: int, max_position: int, params: dict[str, Any]) -> None:
        super().__init__()
        self.head_dim = head_dim
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), _inv_freq(head_dim, params))
        # [max_position, head_dim // 2] each
        self.cos_cache: torch.Tensor
        self.sin_cache: torch.Tensor
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)
        self._step: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # positions, cos, sin

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; q [T, num_heads * head_dim]; k [T, num_kv_heads * head_dim]."""
        if self._step is None or self._step[0] is not positions:
            cos = self.cos_cache[positions].repeat(1, 2).unsqueeze(1).to(q.dtype)  # [T, 1, head_dim]
            sin = self.sin_cache[positions].repeat(1, 2).unsqueeze(1).to(q.dtype)
            self._step = (positions, cos, sin)
        _, cos, sin = self._step
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, self.head_dim)
        half = self.head_dim // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * cos + rotated * sin).view(shape)
