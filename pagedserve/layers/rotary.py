"""Rotary position embeddings (neox layout, as HF Llama/Qwen2/Mistral), with linear, Llama-3, LongRoPE
(Phi-3's "su") and YaRN (gpt-oss, DeepSeek V2/V3) scaling, over the whole head or its first
`partial_rotary_factor` part; M-RoPE (Qwen2-VL's `mrope_section`): 3-D positions, each rotating its
section of the frequencies."""

import math
from typing import TYPE_CHECKING, Required, TypedDict, cast

import torch
from torch import nn

from pagedserve.attention.forward_context import forward_count
from pagedserve.kernels.cpu import fused_ops

if TYPE_CHECKING:
    from transformers import PretrainedConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


class RopeParams(TypedDict, total=False):
    """The fields this module reads from a config's rope dict once `rope_parameters` filled in the
    defaults (HF's dict may hold more, e.g. yarn's, which stay unread). The scaling fields are there
    for their rope_type only: `factor` for linear and llama3 (optional for longrope), `low_freq_factor`
    and `high_freq_factor` for llama3, `long_factor`, `short_factor` and `attention_factor` for longrope;
    `factor`, `beta_fast`, `beta_slow`, `truncate`, `attention_factor`, `mscale` and `mscale_all_dim`
    (all optional but `factor`) for yarn."""

    rope_theta: Required[float]
    rope_type: Required[str]
    partial_rotary_factor: Required[float]
    max_position_embeddings: Required[int]
    original_max_position_embeddings: Required[int]
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    long_factor: list[float]
    short_factor: list[float]
    attention_factor: float | None
    beta_fast: float | None
    beta_slow: float | None
    truncate: bool
    mscale: float | None
    mscale_all_dim: float | None
    mrope_section: list[int]


def rope_parameters(hf_config: "PretrainedConfig", layer_type: str | None = None) -> RopeParams:
    """rope_theta, rope_type and scaling fields, from transformers 5's `rope_parameters` or the older
    `rope_theta` + `rope_scaling` pair. Models whose layer types rotate differently (Gemma 3: local and
    global layers) keep one dict per layer type: `layer_type` picks it."""
    # The config's dicts are untyped JSON; `params` holds them until the defaults below are set.
    params: dict[str, object] = dict(getattr(hf_config, "rope_parameters", None) or {})
    if layer_type is not None and layer_type in params:
        params = dict(cast("dict[str, object]", params[layer_type]))
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    params = {**scaling, **params}
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params["rope_type"] == "su":  # LongRoPE's first name
        params["rope_type"] = "longrope"
    if params["rope_type"] == "mrope":  # transformers 4's name for M-RoPE, whose frequencies are plain
        params["rope_type"] = "default"
    params.setdefault("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    params.setdefault("max_position_embeddings", hf_config.max_position_embeddings)
    params.setdefault(
        "original_max_position_embeddings",
        getattr(hf_config, "original_max_position_embeddings", None) or hf_config.max_position_embeddings,
    )
    if params["rope_type"] == "yarn" and not params.get("factor"):  # HF's default: the stretch itself
        params["factor"] = hf_config.max_position_embeddings / cast(
            int, params["original_max_position_embeddings"]
        )
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type={params['rope_type']!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}."
        )
    return cast(RopeParams, params)


def _exponents(rotary_dim: int) -> torch.Tensor:
    return torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim


def longrope_attention_factor(params: RopeParams) -> float:
    """LongRoPE's scaling of cos/sin: given, or sqrt(1 + ln(factor) / ln(original length)), as HF."""
    given = params.get("attention_factor")
    if given is not None:
        return given
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or params["max_position_embeddings"] / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched `factor` times: 0.1 * mscale * ln(factor) + 1."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(params: RopeParams) -> float:
    """YaRN's scaling of cos/sin: given, else mscale(factor, mscale) / mscale(factor, mscale_all_dim) when
    both are set (DeepSeek), else mscale(factor) (HF's rule)."""
    given = params.get("attention_factor")
    if given is not None:
        return given
    factor, mscale, all_dim = params["factor"], params.get("mscale"), params.get("mscale_all_dim")
    if mscale and all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
    return yarn_mscale(factor)


def yarn_softmax_scale(params: RopeParams) -> float:
    """What MLA models (DeepSeek) multiply their softmax scale by under YaRN: mscale(factor,
    mscale_all_dim) squared, scaling the non-rotary part of q . k too (1 for other rope types)."""
    all_dim = params.get("mscale_all_dim")
    if params["rope_type"] != "yarn" or not all_dim:
        return 1.0
    return yarn_mscale(params["factor"], all_dim) ** 2


def longrope_inv_freq(rotary_dim: int, params: RopeParams, long: bool) -> torch.Tensor:
    factors = torch.tensor(params["long_factor" if long else "short_factor"], dtype=torch.float32)
    return 1.0 / (factors * params["rope_theta"] ** _exponents(rotary_dim))


def yarn_inv_freq(rotary_dim: int, params: RopeParams) -> torch.Tensor:
    """Interpolated (divided by `factor`) frequencies below the original context's, extrapolated ones above,
    a linear ramp between the dimensions that turn beta_slow and beta_fast times over it (HF's rule)."""
    base, factor = params["rope_theta"], params["factor"]
    original = params["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(params.get("beta_fast") or 32), correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** _exponents(rotary_dim)
    extrapolation_weight = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (
        1.0 / pos_freqs
    ) * extrapolation_weight


def _inv_freq(head_dim: int, params: RopeParams) -> torch.Tensor:
    inv_freq = 1.0 / (params["rope_theta"] ** _exponents(head_dim))
    if params["rope_type"] == "yarn":
        return yarn_inv_freq(head_dim, params)
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


def _cos_sin(rotary_dim: int, max_position: int, params: RopeParams) -> tuple[torch.Tensor, torch.Tensor]:
    """[max_position, rotary_dim // 2] each. LongRoPE rotates positions below the original context with
    its short factors and those past it with its long ones (vLLM's rule; HF switches the whole sequence
    once it is longer than the original context)."""
    positions = torch.arange(max_position, dtype=torch.float32)
    if params["rope_type"] != "longrope":
        freqs = torch.outer(positions, _inv_freq(rotary_dim, params))
        scale = yarn_attention_factor(params) if params["rope_type"] == "yarn" else 1.0
        return freqs.cos() * scale, freqs.sin() * scale
    is_long = (positions >= params["original_max_position_embeddings"])[:, None]
    freqs = torch.where(
        is_long,
        torch.outer(positions, longrope_inv_freq(rotary_dim, params, True)),
        torch.outer(positions, longrope_inv_freq(rotary_dim, params, False)),
    )
    scale = longrope_attention_factor(params)
    return freqs.cos() * scale, freqs.sin() * scale


class RotaryEmbedding(nn.Module):
    """Rotates q and k by position; cos/sin are precomputed in float32 for every position. One instance
    serves every layer of a model. `is_neox_style`: rotate the two halves of the rotary part against each
    other (HF Llama's rotate_half), else adjacent pairs (GPT-J's interleaved layout). On CPU one native
    kernel rotates q and k in place, reading the cos/sin rows by position; the torch path gathers them
    once per step, by the first layer."""

    def __init__(
        self, head_dim: int, max_position: int, params: RopeParams, is_neox_style: bool = True
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        self.is_neox_style = is_neox_style
        cos, sin = _cos_sin(self.rotary_dim, max_position, params)
        # [max_position, rotary_dim // 2] each
        self.cos_cache: torch.Tensor
        self.sin_cache: torch.Tensor
        self.register_buffer("cos_cache", cos, persistent=False)
        self.register_buffer("sin_cache", sin, persistent=False)
        # (positions, forward pass, cos, sin) of the last angles computed
        self._step: tuple[torch.Tensor, int, torch.Tensor, torch.Tensor] | None = None
        self.mrope_section = params.get("mrope_section")
        if self.mrope_section is not None and sum(self.mrope_section) != self.rotary_dim // 2:
            raise ValueError(
                f"mrope_section={self.mrope_section} (config.json's rope parameters) must sum to half the "
                f"rotary dimension, {self.rotary_dim // 2}."
            )

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] (under M-RoPE [3, T]: temporal, height, width); q [T, num_heads * head_dim]; k
        [T, num_kv_heads * head_dim]. The native kernel rotates q and k in place (they are the step's fresh
        projections); the torch path returns new ones."""
        plain = positions.dim() == 1
        if plain and fused_ops.usable(q) and q.dim() == 2 and q.stride(-1) == 1 and k.stride(-1) == 1:
            cos, sin = self.cos_cache, self.sin_cache
            fused_ops.rotary_embedding(positions, q, k, self.head_dim, cos, sin, self.is_neox_style)
            return q, k
        return self.forward_torch(positions, q, k)

    def forward_torch(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` in torch ops (the reference the kernel is tested against)."""
        forward = forward_count()
        if self._step is None or self._step[0] is not positions or self._step[1] != forward:
            cos, sin = self._angles(positions, self.cos_cache), self._angles(positions, self.sin_cache)
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # [T, rotary_dim // 2]
            # [T, 1, rotary_dim]: each angle twice, for both members of its pair
            if self.is_neox_style:
                cos, sin = cos.repeat(1, 2), sin.repeat(1, 2)
            else:
                cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
            self._step = (positions, forward, cos.unsqueeze(1), sin.unsqueeze(1))
        _, _, cos, sin = self._step
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _angles(self, positions: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """cache's rows [T, rotary_dim // 2] at `positions`; under M-RoPE section i of the frequencies from
        position row i % 3 (HF's rule)."""
        rows = cache[positions]
        if positions.dim() == 1:
            return rows
        assert self.mrope_section is not None, "3-D positions come from an M-RoPE family's worker"
        parts = torch.split(rows, self.mrope_section, dim=-1)
        return torch.cat([part[i % 3] for i, part in enumerate(parts)], dim=-1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, self.head_dim)
        x, passed = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        if self.is_neox_style:
            half = self.rotary_dim // 2
            rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        else:  # pairs (2i, 2i + 1) -> (-x[2i + 1], x[2i])
            rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        return torch.cat((x * cos + rotated * sin, passed), dim=-1).view(shape)
