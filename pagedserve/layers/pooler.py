"""Pooling: a batch's hidden states -> one vector per prompt (CLS, mean or last token), then each
request's head: Matryoshka truncation and L2 normalization for embeddings, softmax (sigmoid for one
label) over a classifier's logits."""

import torch
import torch.nn.functional as F


def pool(hidden: torch.Tensor, seq_lens: list[int], pooling_type: str) -> torch.Tensor:
    """hidden [T, H] of prompts laid end to end (`seq_lens` tokens each) -> [len(seq_lens), H], float32."""
    lens = torch.tensor(seq_lens, device=hidden.device)
    ends = torch.cumsum(lens, 0)
    if pooling_type == "CLS":
        return hidden[ends - lens].float()
    if pooling_type == "LAST":
        return hidden[ends - 1].float()
    assert pooling_type == "MEAN", pooling_type
    # NOTE: one mean per prompt: ~100x faster on CPU than a scatter (index_add_) into the sums.
    return torch.stack([part.float().mean(0) for part in hidden.split_with_sizes(seq_lens)])


def embedding_head(pooled: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """One embedding [H]: the first `dimensions` values (vLLM's order: truncate, then normalize)."""
    if dimensions is not None:
        pooled = pooled[:dimensions]
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled


def classification_head(logits: torch.Tensor, activation: bool) -> torch.Tensor:
    """One prompt's logits [labels] -> probabilities (sigmoid for a single score, else softmax)."""
    if not activation:
        return logits
    return torch.sigmoid(logits) if logits.numel() == 1 else torch.softmax(logits, dim=-1)
