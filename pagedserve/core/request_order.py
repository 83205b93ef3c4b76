"""The order in which the scheduler serves requests (--scheduling-policy).

fcfs: running groups grow oldest first and the newest is preempted first; waiting requests are admitted
in queue order (preempted ones go back to its head); swapped-out groups come back oldest first.
priority (vLLM's rule): every one of those orders is by (priority, arrival): a lower `priority` value is
served first and preempted last, ties go by arrival time, and a waiting request that cannot be admitted
preempts running groups whose priority value is larger than its own."""

from collections.abc import Callable, Iterable

from pagedserve.config import SchedulerConfig
from pagedserve.core.request import Request


def urgency(request: Request) -> tuple[int, float]:
    """Sort key under the priority policy: smaller is more urgent."""
    return (request.priority, request.arrival_time)


class RequestOrder:
    def __init__(self, config: SchedulerConfig) -> None:
        self.by_priority = config.policy == "priority"

    def running_groups(self, groups: list[list[Request]]) -> list[list[Request]]:
        """The running groups in the order they grow; preemption takes victims from the end. `groups`
        comes oldest first (a group's members share one priority and arrival)."""
        return sorted(groups, key=lambda group: urgency(group[0])) if self.by_priority else groups

    def next_waiting(self, waiting: Iterable[Request], ready: Callable[[Request], bool]) -> Request | None:
        """The waiting request to admit next among those `ready` (a grammar still compiling keeps its
        place; the ones behind it go on)."""
        candidates = (request for request in waiting if ready(request))
        if self.by_priority:
            return min(candidates, key=urgency, default=None)
        return next(candidates, None)

    def next_swapped(self, swapped: Iterable[list[Request]]) -> list[Request]:
        """The swapped-out group to bring back next (there is at least one)."""
        if self.by_priority:
            return min(swapped, key=lambda group: urgency(group[0]))
        return next(iter(swapped))

    def outranks(self, request: Request, group: list[Request]) -> bool:
        """Whether waiting `request` may preempt running `group` to get in (the priority policy only)."""
        return self.by_priority and request.priority < group[0].priority
