"""CLIP's vision tower (LLaVA's image encoder): patch embedding, class token, learned positions, pre-norm
transformer layers with full (bidirectional) attention over one image's patches. Images are small batches
of fixed size, so it runs as plain dense torch modules, replicated on every tensor-parallel rank."""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.layers.activation import plain_activation

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        hidden, patch = config.hidden_size, config.patch_size
        self.class_embedding = nn.Parameter(torch.empty(hidden))
        self.patch_embedding = nn.Conv2d(config.num_channels, hidden, patch, stride=patch, bias=False)
        num_positions = (config.image_size // patch) ** 2 + 1
        self.position_embedding = nn.Embedding(num_positions, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[images, C, H, W] -> [images, 1 + patches, hidden]."""
        patches = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        patches = patches.flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        out: torch.Tensor = torch.cat([cls, patches], dim=1) + self.position_embedding.weight
        return out


class CLIPAttention(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, width = hidden.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, length, self.num_heads, -1).transpose(1, 2)

        q, k, v = heads(self.q_proj(hidden)), heads(self.k_proj(hidden)), heads(self.v_proj(hidden))
        out = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch of its image
        projected: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(batch, length, width))
        return projected


class CLIPMLP(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = plain_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(self.act(self.fc1(x)))
        return out


class CLIPEncoderLayer(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = CLIPAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = CLIPMLP(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.layer_norm1(hidden))
        out: torch.Tensor = hidden + self.mlp(self.layer_norm2(hidden))
        return out


class CLIPEncoder(nn.Module):
    def __init__(self, config: "PretrainedConfig", num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(config) for _ in range(num_layers))


class CLIPVisionTower(nn.Module):
    """The first `num_layers` layers of CLIP's vision model: their output is the hidden state LLaVA reads
    (`vision_feature_layer`), so later layers and the final norm are never built nor loaded."""

    def __init__(self, config: "PretrainedConfig", num_layers: int) -> None:
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # HF's spelling
        self.encoder = CLIPEncoder(config, num_layers)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[images, C, H, W] -> [images, 1 + patches, hidden] after `num_layers` layers."""
        hidden: torch.Tensor = self.pre_layrnorm(self.embeddings(pixel_values))
        for layer in self.encoder.layers:
            hidden = layer(hidden)
        return hidden
