"""LLaVA-1.5 (LlavaForConditionalGeneration): CLIP's vision tower, read at `vision_feature_layer`, a
two-layer MLP projector into the language model's width, and a Llama-family language model whose
placeholder tokens (`image_token_index`) take the projected patches' places."""

from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.errors import ConfigError
from pagedserve.layers.activation import plain_activation
from pagedserve.models.clip import CLIPVisionTower
from pagedserve.models.llama import LlamaForCausalLM
from pagedserve.models.vision_language import LLAVA_LAYOUT_PREFIXES, VisionLanguageModel

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# LLaVA-NeXT's newline embedding beside the tower, projector and language model.
_PREFIXES = (*LLAVA_LAYOUT_PREFIXES, ("model.image_newline", "image_newline"))


class LlavaMultiModalProjector(nn.Module):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        bias = getattr(config, "multimodal_projector_bias", True)
        vision, text = config.vision_config.hidden_size, config.text_config.hidden_size
        self.linear_1 = nn.Linear(vision, text, bias=bias)
        self.act = plain_activation(config.projector_hidden_act)
        self.linear_2 = nn.Linear(text, text, bias=bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear_2(self.act(self.linear_1(features)))
        return out


class LlavaForConditionalGeneration(VisionLanguageModel):
    checkpoint_prefixes = _PREFIXES

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.config = config
        vision = config.vision_config
        feature_layer = config.vision_feature_layer
        if not isinstance(feature_layer, int):
            raise ConfigError(
                f"vision_feature_layer={feature_layer!r} (config.json): only one feature layer is supported."
            )
        if config.vision_feature_select_strategy not in ("default", "full"):
            raise ConfigError(
                f"vision_feature_select_strategy={config.vision_feature_select_strategy!r} (config.json) "
                "is not supported; LLaVA uses default or full."
            )
        # HF's hidden_states[k] is the output of k layers (0: the embeddings), negative k from the end.
        num_layers = feature_layer if feature_layer >= 0 else vision.num_hidden_layers + 1 + feature_layer
        self.vision_tower = CLIPVisionTower(vision, num_layers)
        self.multi_modal_projector = LlavaMultiModalProjector(config)
        self.language_model = LlamaForCausalLM(config.text_config)

    def embed_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        features = self.vision_tower(pixel_values)
        if self.config.vision_feature_select_strategy == "default":
            features = features[:, 1:]  # NOTE: the class token has no place among the placeholders
        projected: torch.Tensor = self.multi_modal_projector(features)
        return projected

    def largest_image(self) -> tuple[list[int], tuple[int, int] | None] | None:
        vision = self.config.vision_config
        return [1, vision.num_channels, vision.image_size, vision.image_size], None  # every image: one size
