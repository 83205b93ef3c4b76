"""Groups of requests that share KV blocks: the samples of one prompt, the beams of one search (same
`group_id`). The scheduler grows, preempts and resumes a group as a unit."""

from pagedserve.core.kv_cache_interface import Plan
from pagedserve.core.request import Request


def groups_of(requests: list[Request]) -> list[list[Request]]:
    """`requests` by group (a request without one is its own), in order of first appearance."""
    groups: dict[tuple[bool, str], list[Request]] = {}
    for request in requests:
        key = (request.group_id is not None, request.group_id or request.request_id)
        groups.setdefault(key, []).append(request)
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
