"""The block moves a step asks for before its forward, in every layer's K and V: swap out (device ->
host blocks), swap in (host -> device), copy on write (device -> device)."""

from collections.abc import Callable

import torch

from pagedserve.core.sched_output import BlockPairs, SchedulerOutput

KVCaches = list[tuple[torch.Tensor, ...]]  # per layer (K, V), or an MLA layer's (latent,)
Allocate = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


class KVBlockMover:
    """Owns the host (swap) copy of the KV cache: the device caches' shapes with `num_host_blocks`
    blocks, made by `allocate` (pinned memory on CUDA; on CPU a second tensor pool)."""

    def __init__(self, device_caches: KVCaches, num_host_blocks: int, allocate: Allocate) -> None:
        self.device_caches = device_caches
        self.host_caches: KVCaches = (
            [
                tuple(allocate((num_host_blocks, *t.shape[1:]), t.dtype) for t in layer_caches)
                for layer_caches in device_caches
            ]
            if num_host_blocks
            else []
        )

    def apply(self, out: SchedulerOutput) -> None:
        """Swap out, swap in, then copy: a block freed by a swap-out may be the target of a copy, and a
        copy may read a block just swapped in. Raises AssertionError if a swap is asked of a worker
        without swap space (the scheduler never does)."""
        if out.blocks_to_swap_out or out.blocks_to_swap_in:
            assert self.host_caches, "a swap was scheduled but this worker has no swap space"
        _move(self.device_caches, self.host_caches, out.blocks_to_swap_out)
        _move(self.host_caches, self.device_caches, out.blocks_to_swap_in)
        _move(self.device_caches, self.device_caches, out.blocks_to_copy)


@torch.inference_mode()
def _move(sources: KVCaches, targets: KVCaches, pairs: BlockPairs) -> None:
    """targets[dst] = sources[src] for every (src, dst), each layer's K and V. All sources are read
    before any target is written."""
    if not pairs:
        return
    src_ids = torch.tensor([src for src, _ in pairs])
    dst_ids = torch.tensor([dst for _, dst in pairs])
    for source_kv, target_kv in zip(sources, targets):
        for source, target in zip(source_kv, target_kv):
            # NOTE: a blocking copy across devices: the host side must hold the data before it is used.
            blocks = source.index_select(0, src_ids.to(source.device)).to(target.device)
            target.index_copy_(0, dst_ids.to(target.device), blocks)
