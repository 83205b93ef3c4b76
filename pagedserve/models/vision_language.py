"""What the image models built as LLaVA is (LLaVA, Gemma 3) share: a vision tower, a projector into the
language model's width and a decoder whose placeholder tokens take the projected embeddings' places; the
checkpoint names of both layouts transformers saves, and the loading of the three parts."""

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from pagedserve.models.interface import IntermediateTensors, MultiModalLM
from pagedserve.models.llama import LlamaForCausalLM, LlamaModel

# Checkpoint prefixes (transformers >= 4.52 saves the first of each pair; LLaVA-1.5 and Gemma 3
# checkpoints the second) -> ours.
_PREFIXES = (
    ("model.language_model.", "language_model.model."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("lm_head.", "language_model.lm_head."),
    ("vision_tower.vision_model.", "vision_tower."),
)


class VisionLanguageModel(MultiModalLM):
    """Subclasses build `vision_tower`, `multi_modal_projector` and `language_model` (a Llama-family
    decoder), and say how the tower's output becomes the placeholders' embeddings (`embed_images`)."""

    vision_tower: nn.Module
    multi_modal_projector: nn.Module
    language_model: LlamaForCausalLM

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        trunk = self.language_model.model
        assert isinstance(trunk, LlamaModel), "LlamaForCausalLM's trunk"
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
        """The language model's tensors through its own loader; the vision tower's and the projector's
        copied as they are (tensors of parts never built, such as a tower's unused layers, skipped)."""
        params = dict(self.named_parameters())
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
