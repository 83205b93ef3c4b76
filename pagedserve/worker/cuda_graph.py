"""CUDA graphs for decode steps: one graph per batch-size bucket (--cuda-graph-sizes), captured once
after the KV cache is allocated and replayed for every decode-only step that fits a bucket.

A graph replays fixed kernels on fixed addresses, so the step's inputs are copied into static buffers
and the batch is padded to its bucket: padding rows have token 0 at position 0, a KV slot of -1 (the
K/V write skips it), one key in the null block 0 (finite, ignored) and are sliced off the output.
The backend must build its metadata over the buffers (`build_graph_metadata`: the triton backend).
"""

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedserve.attention.backends.base import AnyAttentionBackend
from pagedserve.attention.forward_context import ForwardContext
from pagedserve.logger import init_logger
from pagedserve.utils import cdiv
from pagedserve.worker.input_batch import BatchInputs

logger = init_logger(__name__)

PAD_SLOT = -1


def graph_bucket(num_requests: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest captured size that holds `num_requests` (sizes ascending), None if none does."""
    index = bisect.bisect_left(sizes, num_requests)
    return sizes[index] if index < len(sizes) else None


@dataclass
class DecodeBuffers:
    """The static inputs of every captured graph, sized for the largest bucket; bucket b uses rows [:b]."""

    input_ids: torch.Tensor  # [max_size] int64
    positions: torch.Tensor  # [max_size] int64
    slot_mapping: torch.Tensor  # [max_size] int64
    seq_lens: torch.Tensor  # [max_size] int32
    query_start_loc: torch.Tensor  # [max_size + 1] int32: 0, 1, 2, ... (one token per request)
    block_tables: torch.Tensor  # [max_size, max_blocks_per_request] int64

    @classmethod
    def allocate(cls, max_size: int, max_blocks_per_request: int, device: torch.device) -> "DecodeBuffers":
        buffers = cls(
            torch.zeros(max_size, dtype=torch.int64, device=device),
            torch.zeros(max_size, dtype=torch.int64, device=device),
            torch.full((max_size,), PAD_SLOT, dtype=torch.int64, device=device),
            torch.ones(max_size, dtype=torch.int32, device=device),
            torch.arange(max_size + 1, dtype=torch.int32, device=device),
            torch.zeros(max_size, max_blocks_per_request, dtype=torch.int64, device=device),
        )
        return buffers

    def fill(self, batch: BatchInputs, size: int) -> None:
        """Copy a decode-only batch of n <= size requests into rows [:n] and pad rows [n:size]."""
        n = len(batch.request_ids)
        common = batch.attention[0]  # one KV cache group: graphs are off with several
        assert common.num_decodes == n <= size, "only decode-only batches that fit the bucket"
        width = common.block_tables.shape[1]
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_mapping[:n].copy_(common.slot_mapping)
        self.seq_lens[:n].copy_(common.seq_lens_tensor)
        self.block_tables[:n, :width].copy_(common.block_tables)
        self.input_ids[n:size] = 0
        self.positions[n:size] = 0
        self.slot_mapping[n:size] = PAD_SLOT
        self.seq_lens[n:size] = 1
        self.block_tables[n:size] = 0


class CudaGraphRunner:
    """Captures `model` at every size of `sizes` and replays it for decode-only batches."""

    def __init__(
        self,
        model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        backend: AnyAttentionBackend,
        sizes: tuple[int, ...],
        block_size: int,
        max_model_len: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.backend = backend
        self.sizes = sizes
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.buffers = DecodeBuffers.allocate(max(sizes), cdiv(max_model_len, block_size), device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def capture(self) -> None:
        """Largest first, all in one memory pool (smaller graphs reuse the larger ones' memory)."""
        pool = None
        for size in sorted(self.sizes, reverse=True):
            b = self.buffers
            metadata = self.backend.build_graph_metadata(
                b.query_start_loc[: size + 1],
                b.seq_lens[:size],
                b.block_tables[:size],
                b.slot_mapping[:size],
                self.block_size,
                self.max_model_len,
            )
            with ForwardContext(metadata):
                self.model(b.input_ids[:size], b.positions[:size])  # warm up: compile kernels, plan cuBLAS
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self.model(b.input_ids[:size], b.positions[:size])
            pool = graph.pool()
            self.graphs[size] = (graph, hidden)
        torch.cuda.synchronize()

    def bucket(self, batch: BatchInputs) -> int | None:
        """The graph that runs `batch`: decode-only batches within the largest size whose block tables fit
        the buffers; else None (eager)."""
        common = batch.attention[0]  # one KV cache group: graphs are off with several
        if (
            common.num_decodes != len(batch.request_ids)
            or common.block_tables.shape[1] > self.buffers.block_tables.shape[1]
        ):
            return None
        return graph_bucket(len(batch.request_ids), self.sizes)

    def run(self, batch: BatchInputs, size: int) -> torch.Tensor:
        """The hidden states [n, hidden] of the batch's n requests, by replaying the graph of `size`."""
        self.buffers.fill(batch, size)
        graph, hidden = self.graphs[size]
        graph.replay()
        return hidden[: len(batch.request_ids)]
