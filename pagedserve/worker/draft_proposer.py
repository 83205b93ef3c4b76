"""Speculative decoding with a draft model (a small model with the target's tokenizer), the worker's half.

The draft model computes every step's scheduled tokens alongside the target (its own KV cache, the same
block tables and slots, so preemption, swap and prefix caching keep both caches in step). After the
target sampled, it proposes `k` tokens per request greedily, one batched decode per token, starting from
the request's last new token. Those proposals are only needed within the step (the next step computes
the proposed tokens again, in both models): positions past a request's allocated blocks go to scratch
blocks at the end of the draft cache, so the scheduler allocates nothing for them."""

import numpy as np
import torch

from pagedserve.attention.backends.base import AnyAttentionBackend, CommonAttentionMetadata
from pagedserve.attention.forward_context import ForwardContext
from pagedserve.config import ModelConfig
from pagedserve.layers.attention import Attention
from pagedserve.layers.sampler import greedy
from pagedserve.model_loader import load_model
from pagedserve.models.interface import whole_model
from pagedserve.utils import cdiv


class DraftModelProposer:
    def __init__(
        self,
        model_config: ModelConfig,
        num_speculative_tokens: int,
        max_num_seqs: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        with whole_model():  # NOTE: at pp > 1 the last stage holds the whole draft model
            self.model = load_model(model_config, device)
        self.k = num_speculative_tokens
        self.block_size = block_size
        self.device = device
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        # Scratch blocks per request: its proposals may run k - 1 tokens past its last allocated slot.
        self.scratch_per_request = cdiv(self.k, block_size) + 1
        self.num_scratch_blocks = max_num_seqs * self.scratch_per_request
        self.scratch_start = 0  # set by the runner when it allocates the caches

    def propose(
        self,
        backend: AnyAttentionBackend,
        tables: np.ndarray,
        num_blocks: np.ndarray,
        last_tokens: list[int],
        positions: list[int],
    ) -> list[list[int]]:
        """`k` greedy draft tokens per request, from its last token (at `positions[i]`, whose K/V the
        draft model also computes here) and its block table (row i: `num_blocks[i]` blocks, then 0s),
        followed by the request's scratch blocks."""
        n, scratch = len(last_tokens), self.scratch_per_request
        padded = np.zeros((n, tables.shape[1] + scratch), dtype=np.int64)
        padded[:, : tables.shape[1]] = tables
        row_index = np.arange(n)[:, None]
        padded[row_index, num_blocks[:, None] + np.arange(scratch)] = (
            self.scratch_start + row_index * scratch + np.arange(scratch)
        )
        block_tables = torch.from_numpy(padded).to(self.device)
        tokens = torch.tensor(last_tokens, device=self.device)
        position = torch.tensor(positions, device=self.device)
        rows = torch.arange(n, device=self.device)
        query_start_loc = list(range(n + 1))  # one token per request, every step
        query_start_loc_tensor = torch.arange(n + 1, device=self.device)
        proposals = []
        for _ in range(self.k):
            slots = (
                block_tables[rows, position // self.block_size] * self.block_size + position % self.block_size
            )
            seq_lens = position + 1
            common = CommonAttentionMetadata(
                query_start_loc=query_start_loc,
                seq_lens=seq_lens.tolist(),
                query_start_loc_tensor=query_start_loc_tensor,
                seq_lens_tensor=seq_lens,
                block_tables=block_tables,
                slot_mapping=slots,
                num_decodes=n,
                block_size=self.block_size,
            )
            with ForwardContext(backend.build_metadata(common)):
                hidden = self.model(tokens, position)
            logits, head_tokens = self.model.compute_logits_and_greedy(hidden)
            tokens = greedy(logits) if head_tokens is None else head_tokens
            proposals.append(tokens)
            position = position + 1
        return torch.stack(proposals, dim=1).tolist()
