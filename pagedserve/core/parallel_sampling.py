"""Parallel sampling (n or best_of > 1): the samples of one prompt share its KV blocks.

The frontend sends one request per sample, all with the prompt's `group_id`. The first to arrive,
the leader, computes the prompt; the others are held back. Once the leader's prompt is computed they
fork from it: each shares the leader's blocks up to the last prompt token and computes that token
itself, so it samples its first token from its own logits (its own seed). The shared, partly filled
last block is copied by whoever writes into it while others still hold it (copy-on-write).
"""

from pagedserve.core.request import Request, RequestStatus


class ParallelSampling:
    """Holds the samples waiting for their leader. Not thread-safe: the scheduler drives it."""

    def __init__(self) -> None:
        self._groups: dict[str, tuple[Request, list[Request]]] = {}  # group id -> (leader, held)

    def hold(self, request: Request) -> bool:
        """Register a new request; True when it waits for its leader (the caller must not queue it)."""
        if request.group_id is None or request.num_prompt_tokens < 2 or request.beam_search is not None:
            return False
        group = self._groups.get(request.group_id)
        if group is None:
            self._groups[request.group_id] = (request, [])
            return False
        group[1].append(request)
        return True

    def ready(self) -> list[tuple[Request, list[Request]]]:
        """(leader, held samples) of the groups whose leader is running with its prompt computed:
        the samples can fork now. They are forgotten here."""
        ready = [
            group_id
            for group_id, (leader, _) in self._groups.items()
            if leader.status is RequestStatus.RUNNING
            and leader.num_computed_tokens >= leader.num_prompt_tokens
        ]
        return [self._groups.pop(group_id) for group_id in ready]

    def forget(self, request: Request) -> list[Request]:
        """A request ended. A held sample is dropped; a leader that ends before its samples forked
        releases them, returned for the caller to queue (they compute the prompt themselves)."""
        group_id = request.group_id
        group = self._groups.get(group_id) if group_id is not None else None
        if group_id is None or group is None:
            return []
        leader, held = group
        if leader is request:
            del self._groups[group_id]
            return held
        if request in held:
            held.remove(request)
        return []

    def num_held_by(self, leader: Request) -> int:
        """How many samples wait to fork from `leader` (0 if it leads none)."""
        group = self._groups.get(leader.group_id) if leader.group_id is not None else None
        return len(group[1]) if group is not None and group[0] is leader else 0

    def num_held(self) -> int:
        return sum(len(held) for _, held in self._groups.values())
