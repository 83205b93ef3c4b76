"""--scheduling-policy priority: which running groups a waiting request that cannot be admitted preempts.

Only groups it outranks (a larger `priority` value) that have yielded fewer than `MAX_YIELDS` times, and
only the fewest that make room for it: its seats, its adapter's slot (--max-loras: a slot frees only when
every running request of an adapter goes) and its KV blocks. When preempting every such group would still
not admit it, nobody is preempted: it waits, and the running requests keep their work (preempting them in
vain would recompute them, be re-admitted and preempted again, over and over)."""

from collections.abc import Callable
from dataclasses import dataclass

from pagedserve.core.request import Request
from pagedserve.core.request_order import RequestOrder

# How many times a request yields to more urgent waiting ones; after that it is preempted only when the
# pool is short. Each yield admits a more urgent request, so the work a request loses is bounded, and a
# stream of ever more urgent arrivals cannot keep it from finishing.
MAX_YIELDS = 2

Groups = list[list[Request]]


def may_yield(group: list[Request]) -> bool:
    """Whether `group` may still be preempted for a more urgent waiting request."""
    return all(request.num_yields < MAX_YIELDS for request in group)


@dataclass(frozen=True)
class UrgentPreemption:
    order: RequestOrder

    def victims(self, request: Request, groups: Groups, admits: Callable[[Groups], bool]) -> Groups:
        """The groups to preempt so that `request` is admitted, least urgent first; none when it is
        admitted as it is, or when no choice would admit it. `groups` are the running ones in
        `RequestOrder.running_groups`' order (least urgent last); `admits(victims)` says whether
        `request` would be admitted with `victims` preempted, and admits more the more are preempted."""
        candidates = [g for g in reversed(groups) if self.order.outranks(request, g) and may_yield(g)]
        if not candidates or admits([]) or not admits(candidates):
            return []
        # The shortest run of the least urgent that admits it (a binary search: admits is monotone)...
        low, high = 1, len(candidates)
        while low < high:
            middle = (low + high) // 2
            if admits(candidates[:middle]):
                high = middle
            else:
                low = middle + 1
        chosen = candidates[:low]
        # ... less those it does not need (the last one it does), sparing the more urgent first: with
        # --max-loras the slot may come from a more urgent group than blocks or seats would.
        for group in reversed(chosen[:-1]):
            spared = [g for g in chosen if g is not group]
            if admits(spared):
                chosen = spared
        return chosen
