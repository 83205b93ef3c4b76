"""The pooling scheduler: whole prompts, first come first served, under the token budget and the seat
limit; every scheduled prompt finishes in its step with its pooled vector; aborts leave nothing."""

from pagedserve.config import SchedulerConfig
from pagedserve.core.pooling_scheduler import PoolingScheduler
from pagedserve.core.request import Request
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.protocol import EngineCoreRequest, FinishReason, PoolingParams
from pagedserve.sampling_params import SamplingParams


def _request(request_id: str, num_tokens: int) -> Request:
    return Request(
        EngineCoreRequest(
            request_id,
            [1] * num_tokens,
            SamplingParams(max_tokens=1),
            None,
            0.0,
            pooling_params=PoolingParams(),
        )
    )


def test_batches_whole_prompts_under_the_budget() -> None:
    scheduler = PoolingScheduler(SchedulerConfig(3, 100, 100, pooling=True), 16)
    for i, n in enumerate([40, 50, 20, 100, 5]):
        scheduler.add_request(_request(f"r{i}", n))
    first = scheduler.schedule()
    assert [r.request_id for r in first.scheduled_new_reqs] == ["r0", "r1"]  # r2 would pass 100 tokens
    assert first.total_num_scheduled_tokens == 90 and first.first_scheduled_req_ids == ["r0", "r1"]
    outputs = scheduler.update_from_output(first, ModelRunnerOutput({}, pooled={"r0": [1.0], "r1": [2.0]}))
    assert [(o.request_id, o.pooled, o.finish_reason) for o in outputs] == [
        ("r0", [1.0], FinishReason.STOP),
        ("r1", [2.0], FinishReason.STOP),
    ]
    assert [r.request_id for r in scheduler.schedule().scheduled_new_reqs] == ["r2"]  # r3 fills a step alone
    assert [r.request_id for r in scheduler.schedule().scheduled_new_reqs] == ["r3"]
    scheduler.abort_requests(["r4"])
    assert not scheduler.has_unfinished_requests() and scheduler.schedule().is_empty


def test_max_num_seqs_caps_a_step() -> None:
    scheduler = PoolingScheduler(SchedulerConfig(2, 100, 100, pooling=True), 16)
    for i in range(5):
        scheduler.add_request(_request(f"r{i}", 1))
    assert len(scheduler.schedule().scheduled_new_reqs) == 2
    assert scheduler.get_stats().num_waiting_reqs == 3
