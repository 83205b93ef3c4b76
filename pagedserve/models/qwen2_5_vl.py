"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): its vision tower (models/qwen2_5_vl_vision.py) and a
Qwen2 language model whose rotary embedding is M-RoPE (the config's `mrope_section`): positions arrive as
[3, T] (temporal, height, width), worker/mrope_positions.py computes them. An image's pixel values arrive
folded in its grid, [1, t, h, w, patch values] (engine/grid_images.py)."""

from typing import TYPE_CHECKING

import torch

from pagedserve.models.qwen2 import Qwen2ForCausalLM
from pagedserve.models.qwen2_5_vl_vision import Qwen2_5_VisionTransformer
from pagedserve.models.vision_language import VisionLanguageModel

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Checkpoint prefixes (transformers >= 4.52 in memory, and some checkpoints, first; Qwen's own
# checkpoints second) -> ours.
_PREFIXES = (
    ("model.visual.", "visual."),
    ("model.language_model.", "language_model.model."),
    ("model.", "language_model.model."),
    ("lm_head.", "language_model.lm_head."),
)


class Qwen2_5_VLForConditionalGeneration(VisionLanguageModel):
    checkpoint_prefixes = _PREFIXES

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.config = config
        self.visual = Qwen2_5_VisionTransformer(config.vision_config)
        self.language_model = Qwen2ForCausalLM(config.text_config)

    def embed_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [images, t, h, w, patch values] of images that share a grid -> [images, tokens,
        hidden]."""
        images, t, h, w, _ = pixel_values.shape
        out: torch.Tensor = self.visual(pixel_values.reshape(images, t * h * w, -1), (t, h, w))
        return out
