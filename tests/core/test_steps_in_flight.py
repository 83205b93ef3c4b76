"""Pipeline micro-batches in the scheduler (no torch): with batches in flight, a request is never
scheduled again before its step returns, nothing is preempted, an aborted request's blocks stay held
until its step returns, and the batches take even shares."""

import random
from collections import deque

from core.utils import make_request, make_scheduler

from pagedserve.core.request import RequestStatus
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.core.scheduler import Scheduler


def _sampled(scheduler: Scheduler, out: SchedulerOutput) -> ModelRunnerOutput:
    """A token for each request of `out` whose prompt is computed (as the last stage would sample)."""
    requests = [scheduler.requests.get(rid) for rid in out.num_scheduled_tokens]
    return ModelRunnerOutput(
        {r.request_id: 7 for r in requests if r is not None and r.num_computed_tokens >= r.num_tokens}
    )


def test_batches_in_flight_share_the_requests_and_skip_those_in_flight() -> None:
    scheduler = make_scheduler(max_batches_in_flight=2)
    for name in "abcd":
        scheduler.add_request(make_request(name, 5, max_tokens=3))
    first, second = scheduler.schedule(), scheduler.schedule()
    assert list(first.num_scheduled_tokens) == ["a", "b"] and list(second.num_scheduled_tokens) == ["c", "d"]
    assert scheduler.schedule().is_empty, "every request has a step in flight"
    scheduler.update_from_output(first, _sampled(scheduler, first))
    third = scheduler.schedule()
    assert third.num_scheduled_tokens == {"a": 1, "b": 1}
    assert [c.new_token_ids for c in third.scheduled_cached_reqs] == [[7], [7]]


def test_abort_in_flight_keeps_the_blocks_until_the_step_returns() -> None:
    scheduler = make_scheduler(max_batches_in_flight=2)
    kv = scheduler.kv_cache_manager
    scheduler.add_request(make_request("a", 40))
    out = scheduler.schedule()
    free_before = kv.num_free_blocks()
    scheduler.abort_requests(["a"])
    assert kv.num_free_blocks() == free_before and not scheduler.requests
    assert scheduler.update_from_output(out, _sampled(scheduler, out)) == []  # applied to nobody
    assert kv.num_free_blocks() == 63


def test_random_steps_in_flight_never_overlap_and_return_every_block() -> None:
    """Up to three batches in flight, arrivals, aborts and a pool small enough to preempt: no request is
    in two batches in flight or preempted with one, no block of a step in flight goes to another request,
    and every block is back at the end."""
    rng = random.Random(0)
    scheduler = make_scheduler(
        num_blocks=12, block_size=4, max_num_batched_tokens=24, max_batches_in_flight=3, enable_caching=False
    )
    kv, in_flight = scheduler.kv_cache_manager, deque[tuple[SchedulerOutput, dict[str, list[int]]]]()
    for step in range(400):
        if step < 300 and rng.random() < 0.3:
            scheduler.add_request(
                make_request(f"r{step}", rng.randrange(1, 12), max_tokens=rng.randrange(1, 30))
            )
        if in_flight and rng.random() < 0.1:
            scheduler.abort_requests([rng.choice(list(in_flight[0][0].num_scheduled_tokens) or ["none"])])
        if len(in_flight) < 3 and scheduler.has_unfinished_requests():
            out = scheduler.schedule()
            held = {rid for old, _ in in_flight for rid in old.num_scheduled_tokens}
            assert not held & set(out.num_scheduled_tokens)
            blocks = {rid: kv.get_block_ids(rid) for rid in out.num_scheduled_tokens}
            assert not {b for old in in_flight for ids in old[1].values() for b in ids} & {
                b for ids in blocks.values() for b in ids
            }
            in_flight.append((out, blocks))
        if in_flight and (len(in_flight) == 3 or rng.random() < 0.5):
            out, _ = in_flight.popleft()
            assert all(
                scheduler.requests[rid].status is RequestStatus.RUNNING
                for rid in out.num_scheduled_tokens
                if rid in scheduler.requests
            )
            scheduler.update_from_output(out, _sampled(scheduler, out))
    while in_flight:
        out, _ = in_flight.popleft()
        scheduler.update_from_output(out, _sampled(scheduler, out))
    for request_id in list(scheduler.requests):
        scheduler.abort_requests([request_id])
    assert scheduler.get_stats().num_preemptions_total > 0
    assert kv.num_free_blocks() == 11
