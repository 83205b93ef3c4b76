"""What the KV manager hands out: the scheduler's step plan and slot allocations, the counters it reports,
and the picture of who holds each block for the dashboard. Plain values, so their readers never need the
manager's tables."""

from dataclasses import dataclass, field

from pagedserve.core.request import Request

Plan = list[tuple[Request, int]]  # (request, number of new tokens to compute this step)


@dataclass(slots=True)
class SlotAllocation:
    """What one `allocate_slots` changed in a request's block table: the interface between the scheduler
    and the manager, so the scheduler never reads the manager's tables."""

    new_block_ids: list[int]  # appended to the table (prefix hits first)
    # Copies on write, (src, dst) block ids, the workers must make before the step's forward.
    copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def table_rewritten(self) -> bool:
        """A copy on write replaced a block mid-table: the workers need the whole table again."""
        return bool(self.copies)


# Block states in a BlockOwners picture, besides k >= 1 (held by request_ids[k - 1] alone).
FREE, CACHED, SHARED = 0, -1, -2


@dataclass(frozen=True, slots=True)
class BlockOwners:
    """Who holds each usable block (the null block left out), for the dashboard."""

    request_ids: list[str]
    # Per usable block: k >= 1 (request_ids[k - 1] alone), SHARED (several requests), CACHED (free but
    # holding a revivable cached prefix) or FREE.
    owners: list[int]
    block_size: int
    num_host_blocks: int = 0  # swap space
    num_free_host_blocks: int = 0


@dataclass(frozen=True, slots=True)
class KVCacheStats:
    """The manager's counters, as the scheduler reports them."""

    usage: float  # fraction of usable blocks held
    num_free_blocks: int
    num_allocated_slots: int  # slots in the tables; a shared block counts once per holder
    num_shared_blocks: int  # blocks held by more than one request
    num_blocks_saved: int  # blocks the holders would need on top if nothing were shared
    prefix_cache_queries: int  # tokens looked up (cumulative)
    prefix_cache_hits: int  # tokens found (cumulative)
