"""Gemma 3 with images (Gemma3ForConditionalGeneration): SigLIP's vision tower, Gemma 3's projector (each
image's patch grid average-pooled to `mm_tokens_per_image` tokens, a (1 + w) RMSNorm, one projection
matrix) and Gemma 3's language model. An image's placeholder tokens attend each other both ways during
prefill: the family table says so (families.py), the attention masks and the scheduler act on it."""

import copy
from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.layers.layernorm import GemmaRMSNorm
from pagedserve.models.gemma3_text import Gemma3ForCausalLM
from pagedserve.models.siglip import SiglipVisionTower
from pagedserve.models.vision_language import LLAVA_LAYOUT_PREFIXES, VisionLanguageModel

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class Gemma3MultiModalProjector(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        vision = config.vision_config
        self.mm_input_projection_weight = nn.Parameter(
            torch.empty(vision.hidden_size, config.text_config.hidden_size)
        )
        self.mm_soft_emb_norm = GemmaRMSNorm(vision.hidden_size, vision.layer_norm_eps)
        self.patches_per_side = vision.image_size // vision.patch_size
        kernel = self.patches_per_side // int(config.mm_tokens_per_image**0.5)
        self.avg_pool = nn.AvgPool2d(kernel_size=kernel, stride=kernel)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[images, patches, vision hidden] -> [images, mm_tokens_per_image, text hidden]."""
        images, _, width = features.shape
        grid = features.transpose(1, 2).reshape(images, width, self.patches_per_side, self.patches_per_side)
        pooled = self.avg_pool(grid).flatten(2).transpose(1, 2)
        normed: torch.Tensor = self.mm_soft_emb_norm(pooled)
        return (normed @ self.mm_input_projection_weight).to(features.dtype)


class Gemma3ForConditionalGeneration(VisionLanguageModel):
    checkpoint_prefixes = LLAVA_LAYOUT_PREFIXES

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.config = config
        self.vision_tower = SiglipVisionTower(config.vision_config)
        self.multi_modal_projector = Gemma3MultiModalProjector(config)
        # NOTE: HF ties the LM head by the whole config's flag, not the text config's.
        text = copy.copy(config.text_config)
        text.tie_word_embeddings = config.tie_word_embeddings
        self.language_model = Gemma3ForCausalLM(text)
        self.vocab_size = text.vocab_size

    def embed_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        projected: torch.Tensor = self.multi_modal_projector(self.vision_tower(pixel_values))
        return projected

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        # NOTE: a placeholder id past the vocabulary (HF allows it) embeds as token 0: its row is replaced.
        return super().embed_input_ids(input_ids.masked_fill(input_ids >= self.vocab_size, 0))
