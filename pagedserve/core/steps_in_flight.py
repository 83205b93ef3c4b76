"""Requests with a step in flight: scheduled and sent to the workers, their output not back yet.

With pipeline stages the engine keeps up to `max_batches` scheduled batches in flight
(engine/batch_queue.py), so that the stages work on different batches at once. The scheduler then keeps
two rules, which this collaborator tracks for it:
- one step in flight per request: a request is scheduled again only once its last step's tokens are back
  (a decode needs the sampled token; the workers' copy of the request must hear every token);
- no preemption while any step is in flight (a preempted request never has one), and an aborted request
  keeps its KV blocks until its step returns (freed then), so no block is reused while a step may write it.
At max_batches 1 the engine applies each step's output before the next schedule: nothing is tracked,
and the scheduler decides exactly as without this collaborator.
"""

from collections.abc import Container, Iterable

from pagedserve.core.request import Request


class StepsInFlight:
    """The ids of the requests with a step in flight, and the ended ones whose blocks wait for it."""

    def __init__(self, max_batches: int) -> None:
        self.max_batches = max_batches  # the engine's batch queue: 1, or --pipeline-parallel-size
        self._request_ids: set[str] = set()
        self._ended: dict[str, Request] = {}  # aborted while in flight: their blocks go when the step returns

    def __contains__(self, request_id: object) -> bool:
        """The request has a step in flight."""
        return request_id in self._request_ids

    @property
    def any(self) -> bool:
        """Some step is in flight (its requests, even ended ones, may still hold blocks)."""
        return bool(self._request_ids)

    def idle_groups(self, groups: list[list[Request]]) -> list[list[Request]]:
        """The groups none of whose members has a step in flight: those the scheduler may schedule."""
        if not self._request_ids:
            return groups
        return [group for group in groups if not any(r.request_id in self._request_ids for r in group)]

    def drafting(self, running: list[Request], step_request_ids: Container[str]) -> list[Request]:
        """The running requests to propose drafts for after a step returned: with batches in flight, that
        step's own (the others keep the drafts proposed after their own step, which a draft model's output
        of this step does not carry); all of them with one batch at a time."""
        if self.max_batches == 1:
            return running
        return [request for request in running if request.request_id in step_request_ids]

    def sent(self, request_ids: Iterable[str]) -> None:
        """A step went out with these requests (nothing is tracked with one batch at a time)."""
        if self.max_batches > 1:
            self._request_ids.update(request_ids)

    def returned(self, request_ids: Iterable[str]) -> list[Request]:
        """A step's output is back: its requests are free to be scheduled. Returns the requests that ended
        while it ran, whose blocks the caller frees now."""
        if not self._request_ids and not self._ended:  # NOTE: one batch at a time: nothing is tracked
            return []
        ended = []
        for request_id in request_ids:
            self._request_ids.discard(request_id)
            if self._ended:
                request = self._ended.pop(request_id, None)
                if request is not None:
                    ended.append(request)
        return ended

    def keep_blocks_of(self, request: Request) -> bool:
        """An ending request: True (and it is remembered) when its step is in flight, so that its blocks
        are freed when the step returns instead of now."""
        if request.request_id not in self._request_ids:
            return False
        self._ended[request.request_id] = request
        return True
