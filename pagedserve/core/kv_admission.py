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
        num_released: int = 0,
    ) -> bool:
        """Whether `request`, which would compute up to its first `num_tokens` tokens (prefix hits
        `hits` included), may be admitted now, or once requests not in `running` are preempted and free
        `num_released` more blocks. With nothing running it always may: the pool holds one request of
        max_model_len, and refusing it would leave the engine idle."""
        if not running:
            return True
        lookahead = self.lookahead_tokens or kv.block_size
        need = kv.num_blocks_to_grow(request, _capped(request, num_tokens + lookahead), hits)
        for other in running:
            need += kv.num_blocks_to_grow(other, _capped(other, other.num_computed_tokens + lookahead))
        return need <= kv.num_free_blocks() + num_released


def _capped(request: Request, num_tokens: int) -> int:
    """`num_tokens`, at most the length the request may reach."""
    return min(num_tokens, request.num_prompt_tokens + request.max_tokens)
