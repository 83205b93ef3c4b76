"""Groups of requests that share KV blocks: the samples of one prompt, the beams of one search (same
`group_id`). The scheduler grows, preempts and resumes a group as a unit."""

from pagedserve.core.kv_cache_interface import Plan
from pagedserve.core.request import Request


def groups_of(requests: list[Request]) -> list[list[Request]]:
    """`requests` by group (a request without one is its own), in order of first appearance."""
    # NOTE: keyed by the group id (str) or, for a request of its own, the object's id (int): never equal.
    groups: dict[str | int, list[Request]] = {}
    for request in requests:
        group_id = request.group_id
        if group_id is None:
            groups[id(request)] = [request]
        else:
            groups.setdefault(group_id, []).append(request)
    return list(groups.values())


def plan_group(group: list[Request], budget: int) -> Plan:
    """Who in `group` computes how many tokens within `budget`, in order. A request with nothing to
    compute (a beam waiting for its siblings' logprobs) is left out."""
    plan: Plan = []
    for request in group:
        num_new = min(request.num_tokens_with_spec - request.num_computed_tokens, budget)
        if num_new > 0:
            plan.append((request, num_new))
            budget -= num_new
    return plan
