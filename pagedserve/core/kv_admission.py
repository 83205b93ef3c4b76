"""KV-aware admission: a waiting request is admitted only when the free blocks cover its own allocation
and still leave the running requests what they will need soon.

Without it, under overload every free block goes to new prompts, the running decodes then find none when
their last block fills, and the scheduler preempts (and recomputes) them, over and over. With it, a
request waits in the queue instead, and preemption is left to requests that outgrow every estimate.
"""

from dataclasses import dataclass

from pagedserve.core.block_pool import KVCacheBlock
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request
from pagedserve.utils import cdiv


@dataclass(frozen=True)
class KVAdmissionPolicy:
    """Reserve, for every running request (and for the one being admitted), the blocks it needs to grow
    `lookahead_tokens` more tokens (default: one block, i.e. one block per request that is not about to
    end), capped at the length it may reach (prompt + max_tokens)."""

    lookahead_tokens: int | None = None

    def admits(
        self,
        request: Request,
        num_tokens: int,
        hits: list[KVCacheBlock] | None,
        running: list[Request],
        kv: KVCacheManager,
    ) -> bool:
        """Whether `request`, which would compute up to its first `num_tokens` tokens (prefix hits
        `hits` included), may be admitted now. With nothing running it always may: the pool holds one
        request of max_model_len, and refusing it would leave the engine idle."""
        if not running:
            return True
        lookahead = self.lookahead_tokens or kv.block_size
        revived = sum(
            1 for block in hits or [] if block.ref_cnt == 0
        )  # cached blocks taken from the free list
        held = kv.num_table_entries(request.request_id) + len(hits or [])
        need = self._blocks(request, num_tokens + lookahead, held, kv) + revived
        for other in running:
            held = kv.num_table_entries(other.request_id)
            need += self._blocks(other, other.num_computed_tokens + lookahead, held, kv)
        return need <= kv.num_free_blocks()

    @staticmethod
    def _blocks(request: Request, num_tokens: int, held: int, kv: KVCacheManager) -> int:
        """Blocks `request` needs beyond the `held` ones to hold `num_tokens` tokens (at most its length),
        one per KV cache group for each block of tokens."""
        longest = request.num_prompt_tokens + request.max_tokens
        return max(0, cdiv(min(num_tokens, longest), kv.block_size) * kv.num_groups - held)
