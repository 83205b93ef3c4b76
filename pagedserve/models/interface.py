"""What the model runner and loader call on every model, whatever its family."""

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.config.parallel import PipelineStage
from pagedserve.distributed import get_pp_stage

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# What a pipeline stage hands the next: (hidden states, residual), [T, hidden] each.
IntermediateTensors = tuple[torch.Tensor, torch.Tensor]

# Set while a model is built whole beside a pipeline stage's part of the target (the draft model).
_WHOLE_MODEL: ContextVar[bool] = ContextVar("whole_model", default=False)


@contextmanager
def whole_model() -> Iterator[None]:
    """Models built inside hold every layer, whatever this worker's pipeline stage."""
    token = _WHOLE_MODEL.set(True)
    try:
        yield
    finally:
        _WHOLE_MODEL.reset(token)


def model_stage(config: "PretrainedConfig") -> PipelineStage:
    """The pipeline stage this process builds: the worker's at pp > 1, else every layer (a model built
    outside a worker or inside `whole_model()`)."""
    stage = get_pp_stage()
    if stage is None or stage.num_stages == 1 or _WHOLE_MODEL.get():
        return PipelineStage(0, 1, 0, config.num_hidden_layers)
    return stage


class CausalLM(nn.Module, ABC):
    """A decoder-only model over one flattened, unpadded batch; attention reads the forward context."""

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden_size]."""

    @abstractmethod
    def forward_stage(
        self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: IntermediateTensors | None
    ) -> torch.Tensor | IntermediateTensors:
        """This process's pipeline stage of `forward`: `intermediate` from the previous stage (None on the
        first, which embeds `input_ids`); (hidden, residual) for the next stage, the last stage's hidden
        states [T, hidden_size] normed."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [R, hidden_size] -> logits [R, vocab_size] (gathered over the tensor-parallel ranks)."""

    def compute_logits_and_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """compute_logits, and each row's argmax where the LM head's kernel found it on the way (the greedy
        rows then skip a second pass over the logits); None where it did not."""
        return self.compute_logits(hidden), None

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each rank's shard of the checkpoint tensors in; returns the parameter names loaded."""

    def loads_tensor(self, name: str) -> bool:
        """Whether this rank loads the checkpoint tensor `name` (HF name): a pipeline stage skips the other
        stages' tensors, which the GGUF reader then never decodes."""
        return True

    def lora_target(self) -> nn.Module:
        """The decoder LoRA adapters apply to (an image model's language model, never its vision tower)."""
        return self


class MultiModalLM(CausalLM):
    """A decoder that also takes images: the model runner embeds the step's tokens, puts each image's
    embeddings (`embed_images`, cached by the worker) in the rows of its placeholder tokens, and runs the
    decoder from those embeddings."""

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """As CausalLM.forward, from `inputs_embeds` [T, hidden_size] when given."""

    @abstractmethod
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> the language model's token embeddings [T, hidden_size]."""

    @abstractmethod
    def embed_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [images, C, H, W] -> embeddings [images, tokens per image, hidden_size]."""

    def embed_sized_images(self, pixel_values: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """The embeddings of images whose tokens depend on their size before the processor (LLaVA-NeXT's
        any-res tiles: pixel_values [images, tiles, C, H, W], all `image_size` (height, width))."""
        raise NotImplementedError(f"{type(self).__name__} takes no image sizes (ImageInput.image_size).")

    def largest_image(self) -> tuple[list[int], tuple[int, int] | None] | None:
        """The pixel values' shape (one image) and its size before the processor (None: the embeddings
        do not depend on it) of the image with the most tokens, which the memory profile encodes; None:
        the profile leaves the encoder out."""
        return None


class EncoderModel(nn.Module, ABC):
    """A bidirectional encoder (BERT family) over one flattened, unpadded batch, for the pooling runner.
    `token_type_ids`: BERT's segment of each token (None: all 0)."""

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids, positions [T] (0 at each prompt's start) -> hidden states [T, hidden_size]."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each rank's shard of the checkpoint tensors in; returns the parameter names loaded."""


class SequenceClassifier(ABC):
    """A model with a classification head over each prompt's pooled hidden state (a cross-encoder)."""

    @abstractmethod
    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled [R, hidden_size] -> logits [R, num_labels]."""


PoolingModel = CausalLM | EncoderModel
