"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): its vision tower (models/qwen2_5_vl_vision.py) and a
Qwen2 language model whose rotary embedding is M-RoPE (the config's `mrope_section`): positions arrive as
[3, T] (temporal, height, width), worker/mrope_positions.py computes them. An image's pixel values arrive
folded in its grid, [1, t, h, w, patch values] (engine/grid_images.py)."""

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from pagedserve.models.interface import IntermediateTensors, MultiModalLM
from pagedserve.models.llama import LlamaModel
from pagedserve.models.qwen2 import Qwen2ForCausalLM
from pagedserve.models.qwen2_5_vl_vision import Qwen2_5_VisionTransformer

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


class Qwen2_5_VLForConditionalGeneration(MultiModalLM):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.config = config
        self.visual = Qwen2_5_VisionTransformer(config.vision_config)
        self.language_model = Qwen2ForCausalLM(config.text_config)

    def embed_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [images, t, h, w, patch values] of images that share a grid -> [images, tokens,
        hidden]."""
        images, t, h, w, _ = pixel_values.shape
        return self.visual(pixel_values.reshape(images, t * h * w, -1), (t, h, w))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        trunk = self.language_model.model
        assert isinstance(trunk, LlamaModel), "Qwen2ForCausalLM's trunk"
        return trunk.embed(input_ids)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.language_model.forward(input_ids, positions, inputs_embeds)

    def forward_stage(
        self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: IntermediateTensors | None
    ) -> torch.Tensor | IntermediateTensors:
        """The language model's stage (images refuse --pipeline-parallel-size > 1: one stage)."""
        return self.language_model.forward_stage(input_ids, positions, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The language model's tensors through its own loader; the vision tower's copied as they are."""
        params = dict(self.visual.named_parameters(prefix="visual"))
        loaded: set[str] = set()

        def language_weights() -> Iterator[tuple[str, torch.Tensor]]:
            # NOTE: one pass, as the checkpoint streams: its tensors are read while their file is open.
            for checkpoint_name, tensor in weights:
                name = _our_name(checkpoint_name)
                if name.startswith("language_model."):
                    yield name.removeprefix("language_model."), tensor
                elif name in params:
                    params[name].data.copy_(tensor)
                    loaded.add(name)

        language = self.language_model.load_weights(language_weights())
        return loaded | {f"language_model.{name}" for name in language}


def _our_name(name: str) -> str:
    for prefix, ours in _PREFIXES:
        if name.startswith(prefix):
            return ours + name.removeprefix(prefix)
    return name
