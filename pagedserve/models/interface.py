"""What the model runner and loader call on every model, whatever its family."""

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch
from torch import nn


class CausalLM(nn.Module, ABC):
    """A decoder-only model over one flattened, unpadded batch; attention reads the forward context."""

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden_size]."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [R, hidden_size] -> logits [R, vocab_size] (gathered over the tensor-parallel ranks)."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each rank's shard of the checkpoint tensors in; returns the parameter names loaded."""

    def loads_tensor(self, name: str) -> bool:
        """Whether this rank loads the checkpoint tensor `name` (HF name): a pipeline stage skips the other
        stages' tensors, which the GGUF reader then never decodes."""
        return True


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
