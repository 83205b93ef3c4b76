"""The order in which the scheduler serves requests (--scheduling-policy).

fcfs: running groups grow oldest first and the newest is preempted first; the waiting queue is in arrival
order (preempted ones go back to its head); swapped-out groups come back oldest first, all of them
before any waiting request is admitted.
priority: every one of those orders is by (priority, arrival): a lower `priority` value is served first
and preempted last, ties go by arrival time (vLLM V1's rule). The waiting queue is kept sorted by
insertion; a preempted request goes before the waiting ones of the same (priority, arrival), as under
fcfs. Waiting and swapped-out requests take turns by priority: a waiting request of a lower value than
every swapped-out group is admitted before they come back. And a waiting request that cannot be admitted
preempts running groups whose priority value is larger than its own when that admits it (vLLM V0 did;
V1 only preempts when a running request cannot grow; which ones: urgent_preemption.py)."""

from bisect import insort_left, insort_right
from collections import deque
from collections.abc import Callable, Collection, Iterable

from pagedserve.config import SchedulerConfig
from pagedserve.core.request import Request


def urgency(request: Request) -> tuple[int, float]:
    """Sort key under the priority policy: smaller is more urgent."""
    return (request.priority, request.arrival_time)


class RequestOrder:
    def __init__(self, config: SchedulerConfig) -> None:
        self.by_priority = config.policy == "priority"

    def enqueue(self, waiting: deque[Request], request: Request, first: bool = False) -> None:
        """Put `request` in the waiting queue: at the tail, or at the head when `first` (it was preempted
        or released: it goes before those that never ran); under priority at its place by (priority,
        arrival), after the equal ones, or before them when `first`."""
        if self.by_priority:
            (insort_left if first else insort_right)(waiting, request, key=urgency)
        elif first:
            waiting.appendleft(request)
        else:
            waiting.append(request)

    def running_groups(self, groups: list[list[Request]]) -> list[list[Request]]:
        """The running groups in the order they grow; preemption takes victims from the end. `groups`
        comes oldest first (a group's members share one priority and arrival)."""
        return sorted(groups, key=lambda group: urgency(group[0])) if self.by_priority else groups

    @staticmethod
    def next_waiting(waiting: Iterable[Request], ready: Callable[[Request], bool]) -> Request | None:
        """The waiting request to admit next among those `ready` (a grammar still compiling keeps its
        place; the ones behind it go on)."""
        return next((request for request in waiting if ready(request)), None)

    def next_admission(
        self, waiting: Iterable[Request], swapped: Collection[list[Request]], ready: Callable[[Request], bool]
    ) -> Request | None:
        """The waiting request to admit next, or None while swapped-out groups come first: under fcfs
        all of them, under priority those it does not outrank."""
        request = self.next_waiting(waiting, ready)
        if request is None or not swapped or self.outranks(request, self.next_swapped(swapped)):
            return request
        return None

    def next_swapped(self, swapped: Iterable[list[Request]]) -> list[Request]:
        """The swapped-out group to bring back next (there is at least one)."""
        if self.by_priority:
            return min(swapped, key=lambda group: urgency(group[0]))
        return next(iter(swapped))

    def outranks(self, request: Request, group: list[Request]) -> bool:
        """Whether waiting `request` goes before `group` (running: it may preempt it; swapped out: it is
        admitted first). The priority policy only, and only by a strictly lower priority value."""
        return self.by_priority and request.priority < group[0].priority
