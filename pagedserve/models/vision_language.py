"""What the image families (LLaVA, Gemma 3, Qwen2.5-VL) share: a language model under `language_model` that does the
decoding, and a checkpoint whose language model tensors go through that model's own loader while the vision
tower's and projector's are copied as they are."""

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from pagedserve.models.interface import CausalLM, IntermediateTensors, MultiModalLM
from pagedserve.models.llama import LlamaForCausalLM, LlamaModel

# The checkpoint names of a LLaVA-built model (LLaVA, Gemma 3): transformers >= 4.52 saves the first of
# each pair, LLaVA-1.5 and older checkpoints the second -> ours.
LLAVA_LAYOUT_PREFIXES = (
    ("model.language_model.", "language_model.model."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("lm_head.", "language_model.lm_head."),
    ("vision_tower.vision_model.", "vision_tower."),
)


class VisionLanguageModel(MultiModalLM):
    """Subclasses build `language_model` and their vision parts, and name `checkpoint_prefixes`: checkpoint
    prefix -> ours, the first that matches applies (the language model's under `language_model.`)."""

    language_model: LlamaForCausalLM
    checkpoint_prefixes: tuple[tuple[str, str], ...] = ()

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        trunk = self.language_model.model
        assert isinstance(trunk, LlamaModel), "a Llama-family trunk"
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

    def lora_target(self) -> nn.Module:
        """Adapters attach to the language model only (config/lora.py says which families take them)."""
        return self.language_model

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    def compute_logits_and_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.language_model.compute_logits_and_greedy(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The language model's tensors through its own loader; the vision parts' copied as they are (the
        ones not built, such as a tower's unused layers, skipped)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()

        def language_weights() -> Iterator[tuple[str, torch.Tensor]]:
            # NOTE: one pass, as the checkpoint streams: its tensors are read while their file is open.
            for checkpoint_name, tensor in weights:
                name = self._our_name(checkpoint_name)
                if name.startswith("language_model."):
                    yield name.removeprefix("language_model."), tensor
                elif name in params:
                    params[name].data.copy_(tensor)
                    loaded.add(name)

        language_model: CausalLM = self.language_model
        language = language_model.load_weights(language_weights())
        return loaded | {f"language_model.{name}" for name in language}

    def _our_name(self, name: str) -> str:
        for prefix, ours in self.checkpoint_prefixes:
            if name.startswith(prefix):
                return ours + name.removeprefix(prefix)
        return name
