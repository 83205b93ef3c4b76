"""Vocabulary-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary."""

import torch
from torch import nn

from pagedserve.distributed import (
    get_tp_rank,
    get_tp_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from pagedserve.quantization.base import embedding_method
from pagedserve.utils import cdiv


class VocabParallelEmbedding(nn.Module):
    """Rows [rank * per_rank, (rank + 1) * per_rank) of the (padded) vocabulary live on each rank."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.vocab_size = vocab_size
        self.num_per_partition = cdiv(vocab_size, self.tp_size)
        self.vocab_start = self.tp_rank * self.num_per_partition
        self.quant_method = embedding_method()
        self.quant_method.create_weights(self, hidden_size, self.num_per_partition)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        # NOTE: the last rank's slice may run past the vocabulary: those padding rows stay zero.
        size = max(0, min(self.num_per_partition, self.vocab_size - self.vocab_start))
        param.data[:size].copy_(loaded.narrow(0, self.vocab_start, size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        if self.tp_size == 1:
            return self.quant_method.embedding(self, input_ids)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_per_partition)
        embeds = self.quant_method.embedding(self, local.masked_fill(outside, 0))
        embeds.masked_fill_(outside.unsqueeze(-1), 0.0)
        return tensor_model_parallel_all_reduce(embeds)


class ParallelLMHead(VocabParallelEmbedding):
    """Hidden states -> logits over the full vocabulary (gathered from every rank's slice)."""

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        """Share the embedding's weight (tie_word_embeddings): its parameters and its quant method."""
        self.quant_method = embedding.quant_method
        for name, param in embedding.named_parameters(recurse=False):
            setattr(self, name, param)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        logits = tensor_model_parallel_all_gather(self.quant_method.apply(self, hidden), dim=-1)
        return logits[:, : self.vocab_size]

    def compute_logits_and_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """compute_logits, and each row's argmax where the quant method's kernel finds it on the way (one
        rank holding the whole vocabulary, no padding rows); None elsewhere."""
        if self.tp_size != 1 or self.num_per_partition != self.vocab_size:
            return self.compute_logits(hidden), None
        return self.quant_method.apply_greedy(self, hidden)
