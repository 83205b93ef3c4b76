"""The pool of KV-cache blocks: ids, reference counts and a free list."""
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class KVCacheBlock:
    """One block of `block_size` token slots in every layer's K and V tensors."""

    block_id: int
    ref_cnt: int = 0


class BlockPool:
    """Hands out blocks from a fixed pool. Block 0 is the reserved null block: it pads block tables
    and is never allocated, so a stray write through padding can never corrupt a live request."""

    def __init__(self, num_blocks: int) -> None:
        assert num_blocks >= 2, "one null block plus at least one usable block"
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1
        self._free: deque[KVCacheBlock] = deque(self.blocks[1:])

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def get_num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` free blocks (ref_cnt 1). The caller checks availability first."""
        assert num_blocks <= len(self._free), f"asked {num_blocks} blocks, {len(self._free)} free"
        blocks = [self._free.popleft() for _ in range(num_blocks)]
        for block in blocks:
            assert block.ref_cnt == 0, f"block {block.block_id} allocated while in use"
            block.ref_cnt = 1
        return blocks

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference to each block; a block whose count reaches zero is free again."""
        for block in blocks:
            assert block.ref_cnt > 0 and block is not self.null_block, f"double free of {block.block_id}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free.append(block)

    def usage(self) -> float:
        """Fraction of usable blocks in use."""
        return 1.0 - len(self._free) / self.num_usable_blocks
