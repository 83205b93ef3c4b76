"""SigLIP's vision tower (Gemma 3's image encoder): patch embedding with learned positions (no class
token), CLIP's pre-norm transformer layers (the same modules and names: full attention over one image's
patches), and a final LayerNorm. Dense torch modules, replicated on every tensor-parallel rank, as CLIP's."""

from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.models.clip import CLIPEncoder

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        hidden, patch = config.hidden_size, config.patch_size
        self.patch_embedding = nn.Conv2d(config.num_channels, hidden, patch, stride=patch)
        self.position_embedding = nn.Embedding((config.image_size // patch) ** 2, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[images, C, H, W] -> [images, patches, hidden]."""
        patches = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        out: torch.Tensor = patches.flatten(2).transpose(1, 2) + self.position_embedding.weight
        return out


class SiglipVisionTower(nn.Module):
    """Every layer of SigLIP's vision model and its final norm (Gemma 3 reads the last hidden state);
    the attention-pooling head is never built nor loaded."""

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.embeddings = SiglipVisionEmbeddings(config)
        self.encoder = CLIPEncoder(config, config.num_hidden_layers)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[images, C, H, W] -> [images, patches, hidden]."""
        hidden: torch.Tensor = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            hidden = layer(hidden)
        out: torch.Tensor = self.post_layernorm(hidden)
        return out
