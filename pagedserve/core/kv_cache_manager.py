"""Per-request block tables over the block pool."""
from pagedserve.core.block_pool import BlockPool, KVCacheBlock
from pagedserve.core.request import Request
from pagedserve.utils import cdiv


class KVCacheManager:
    """Owns every request's block list. Blocks are allocated only as a request grows, so waste is at
    most one partly filled block per request, and all of them return to the pool when it ends."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Make room for `num_new_tokens` more tokens of `request` after its computed ones.
        Returns the ids of newly allocated blocks (maybe empty), or None when the pool is short:
        the caller then preempts someone or waits."""
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_needed = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(blocks)
        if num_needed <= 0:
            return []
        if num_needed > self.block_pool.get_num_free_blocks():
            return None
        new_blocks = self.block_pool.allocate(num_needed)
        blocks.extend(new_blocks)
        return [block.block_id for block in new_blocks]

    def free(self, request: Request) -> None:
        """Return all blocks of a finished, aborted or preempted request to the pool."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        # NOTE: tail blocks first, so the most request-specific blocks are reused first.
        self.block_pool.free(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]

    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    def usage(self) -> float:
        return self.block_pool.usage()

    def num_allocated_slots(self) -> int:
        return self.block_size * sum(len(blocks) for blocks in self.req_to_blocks.values())
