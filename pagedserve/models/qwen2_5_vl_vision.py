"""Qwen2.5-VL's vision tower: 3-D patch embedding (two frames per temporal patch: an image is its own
second frame), 2-D rotary positions (height, width) per patch, RMSNorm blocks whose attention stays within
windows of `window_size` pixels except at `fullatt_block_indexes`, and the patch merger (each
`spatial_merge_size`^2 neighbouring patches -> one token of the language model's width). Dynamic
resolution: an image is a grid of (t, h, w) patches, in the order the HF image processor emits them (the
merged units, each `spatial_merge_size`^2 patches, row by row). Images of one grid run as one batch;
replicated on every tensor-parallel rank, as CLIP's tower."""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.layers.activation import plain_activation

if TYPE_CHECKING:
    from transformers import PretrainedConfig

Grid = tuple[int, int, int]  # an image's (temporal, height, width) patches


class VisionAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        """hidden [images, N, hidden]; attention within each run of `lengths` patches (a window or a
        frame), every patch seeing every other of its run."""
        batch, length, width = hidden.shape
        q, k, v = self.qkv(hidden).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        runs = [
            F.scaled_dot_product_attention(*parts)
            for parts in zip(*(torch.split(x, lengths, dim=2) for x in (q, k, v)))
        ]
        out: torch.Tensor = self.proj(torch.cat(runs, dim=2).transpose(1, 2).reshape(batch, length, width))
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [images, heads, N, head_dim] rotated by cos/sin [N, head_dim] (neox halves, in float32 as HF)."""
    half = x.shape[-1] // 2
    x32 = x.float()
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class VisionMLP(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner)
        self.up_proj = nn.Linear(hidden, inner)
        self.down_proj = nn.Linear(inner, hidden)
        self.act = plain_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return out


class VisionBlock(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(config.hidden_size, eps=1e-6)  # HF's fixed epsilon
        self.attn = VisionAttention(config.hidden_size, config.num_heads)
        self.norm2 = nn.RMSNorm(config.hidden_size, eps=1e-6)
        self.mlp = VisionMLP(config)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        hidden = hidden + self.attn(self.norm1(hidden), cos, sin, lengths)
        out: torch.Tensor = hidden + self.mlp(self.norm2(hidden))
        return out


class PatchMerger(nn.Module):
    """RMSNorm, then each merged unit's patches side by side through a two-layer GELU MLP."""

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.unit_width = config.hidden_size * config.spatial_merge_size**2
        self.ln_q = nn.RMSNorm(config.hidden_size, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(self.unit_width, self.unit_width),
            nn.GELU(),
            nn.Linear(self.unit_width, config.out_hidden_size),
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[images, N, hidden] -> [images, N / merge^2, out_hidden_size]."""
        out: torch.Tensor = self.mlp(self.ln_q(hidden).reshape(hidden.shape[0], -1, self.unit_width))
        return out


class PatchEmbed(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.patch_shape = (
            config.in_channels,
            config.temporal_patch_size,
            config.patch_size,
            config.patch_size,
        )
        kernel = self.patch_shape[1:]
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel, stride=kernel, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[P, C * T * patch * patch] -> [P, hidden]."""
        pixels = patches.reshape(-1, *self.patch_shape).to(self.proj.weight.dtype)
        out: torch.Tensor = self.proj(pixels).flatten(1)
        return out


class Qwen2_5_VisionTransformer(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.merge = config.spatial_merge_size
        # A window's side in merged units.
        self.window_units = config.window_size // config.spatial_merge_size // config.patch_size
        self.full_attention = frozenset(config.fullatt_block_indexes)
        self.patch_embed = PatchEmbed(config)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)
        quarter = config.hidden_size // config.num_heads // 2  # a head's angles: half height, half width
        theta = (config.rope_parameters or {}).get("rope_theta", 10000.0)
        self.inv_freq: torch.Tensor
        exponents = torch.arange(0, quarter, 2, dtype=torch.float32) / quarter
        self.register_buffer("inv_freq", 1.0 / theta**exponents, persistent=False)

    def forward(self, patches: torch.Tensor, grid: Grid) -> torch.Tensor:
        """patches [images, t * h * w, C * T * patch * patch] of images that share `grid` -> their tokens
        [images, t * h * w / merge^2, out_hidden_size]."""
        images, num_patches, _ = patches.shape
        hidden = self.patch_embed(patches.reshape(images * num_patches, -1)).view(images, num_patches, -1)
        order, window_lengths = self._windows(grid)
        unit = self.merge**2
        # Window order: the patches of each window together (a merged unit's patches stay together).
        patch_order = (order[:, None] * unit + torch.arange(unit)).flatten().to(hidden.device)
        hidden = hidden[:, patch_order]
        cos, sin = self._angles(grid, hidden.device)
        cos, sin = cos[patch_order], sin[patch_order]
        frame_lengths = [grid[1] * grid[2]] * grid[0]
        for index, block in enumerate(self.blocks):
            lengths = frame_lengths if index in self.full_attention else window_lengths
            hidden = block(hidden, cos, sin, lengths)
        merged = self.merger(hidden)
        out: torch.Tensor = merged[:, torch.argsort(order).to(hidden.device)]
        return out

    def _angles(self, grid: Grid, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [t * h * w, head_dim]: each patch's height angles then its width angles, twice (the neox
        halves), patches in the processor's order."""
        t, h, w = grid
        m = self.merge
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")

        def in_unit_order(index: torch.Tensor) -> torch.Tensor:
            return index.reshape(h // m, m, w // m, m).transpose(1, 2).flatten().repeat(t)

        angles = torch.cat(
            [torch.outer(in_unit_order(axis).float(), self.inv_freq.cpu()) for axis in (rows, cols)], dim=-1
        )
        angles = torch.cat([angles, angles], dim=-1).to(device)
        return angles.cos(), angles.sin()

    def _windows(self, grid: Grid) -> tuple[torch.Tensor, list[int]]:
        """The merged units in window order (windows of `window_units`^2 units, row by row, the last ones
        of a row or column cut by the image's edge) and each window's length in patches."""
        t, h, w = grid
        units_h, units_w, side = h // self.merge, w // self.merge, self.window_units
        index = torch.arange(t * units_h * units_w).reshape(t, units_h, units_w)
        order: list[torch.Tensor] = []
        lengths: list[int] = []
        for frame in index:
            for top in range(0, units_h, side):
                for left in range(0, units_w, side):
                    window = frame[top : top + side, left : left + side].flatten()
                    order.append(window)
                    lengths.append(window.numel() * self.merge**2)
        return torch.cat(order), lengths
