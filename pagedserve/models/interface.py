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
