"""Admission control, token budgets, deadlines, the stall watchdog and the block snapshot, on constructed
objects (no engine, no server)."""

import threading
import time

import pytest

from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request
from pagedserve.engine.admission import (
    UNBOUNDED,
    AdmissionControl,
    Deadlines,
    ServingLimits,
    apply_token_budgets,
    check_num_samples,
    with_queue_defaults,
)
from pagedserve.engine.block_state import CACHED, FREE, SHARED, snapshot_blocks
from pagedserve.engine.watchdog import StallWatchdog
from pagedserve.errors import CapacityError, ConfigError, InvalidRequestError
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import SamplingParams


def core_request(num_prompt: int, max_tokens: int | None, rid: str = "r") -> EngineCoreRequest:
    return EngineCoreRequest(
        rid, list(range(3, 3 + num_prompt)), SamplingParams(max_tokens=max_tokens), 2, time.time()
    )


def test_limits_are_validated_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--max-num-queued-requests"):
        ServingLimits(max_num_queued_requests=0)
    with pytest.raises(ConfigError, match="--engine-stall-timeout"):
        ServingLimits(engine_stall_timeout=-1)


def test_queue_limits_refuse_with_retry_after() -> None:
    admission = AdmissionControl(ServingLimits(max_num_queued_requests=2, max_num_queued_tokens=100))
    admission.admit([("a", 40)])
    admission.admit([("b", 40)])
    with pytest.raises(
        CapacityError,
        match=r"2 requests are waiting .* limit is 2 \(raise --max-num-queued-requests to queue more, -1 "
        r"for no limit; vLLM queues without a limit\)",
    ):
        admission.admit([("c", 1)])
    admission.dequeue("a", started=True)
    with pytest.raises(
        CapacityError,
        match=r"40 prompt tokens are waiting .* adds 61, over the limit of 100 "
        r"\(raise --max-num-queued-tokens to queue more, -1 for no limit; vLLM queues without a limit\)",
    ) as caught:
        admission.admit([("c", 61)])
    assert 1 <= caught.value.retry_after_s <= 60
    admission.admit([("c", 60)])
    with pytest.raises(InvalidRequestError, match="more than may ever wait"):
        admission.check(1, 101)  # could never be admitted: 400, not 503
    with pytest.raises(InvalidRequestError, match=r"3 prompts .* at once, 2 \(--max-num-queued-requests\)"):
        admission.check(3, 3)  # more prompts than the queue ever holds: 400 even on an idle server
    admission.dequeue("b", started=False)
    admission.dequeue("b", started=False)  # idempotent
    assert admission.num_queued_tokens == 60 and list(admission.queued) == ["c"]


def test_the_queue_is_bounded_by_default_and_unbounded_only_when_asked() -> None:
    with pytest.raises(ConfigError, match=r"-1 for no limit \(--max-num-queued-tokens\)"):
        ServingLimits(max_num_queued_tokens=-2)
    # 8 seats, 100 blocks of 16 tokens: twice the 8 requests and the 1600 tokens the engine holds at once.
    limits = with_queue_defaults(ServingLimits(), max_num_seqs=8, num_kv_blocks=100, block_size=16)
    assert (limits.max_num_queued_requests, limits.max_num_queued_tokens) == (16, 3200)
    # A KV cache smaller than the seats bounds the requests (each running request holds a block).
    assert with_queue_defaults(ServingLimits(), 256, 10, 16).max_num_queued_requests == 20
    admission = AdmissionControl(limits)
    for index in range(16):
        admission.admit([(str(index), 10)])
    with pytest.raises(CapacityError, match=r"limit is 16 \(raise --max-num-queued-requests"):
        admission.admit([("16", 10)])
    unbounded = with_queue_defaults(
        ServingLimits(max_num_queued_requests=UNBOUNDED, max_num_queued_tokens=UNBOUNDED), 8, 100, 16
    )
    assert (unbounded.max_num_queued_requests, unbounded.max_num_queued_tokens) == (UNBOUNDED, UNBOUNDED)
    admission = AdmissionControl(unbounded)
    for index in range(1000):
        admission.admit([(str(index), 10_000)])
    assert len(admission.queued) == 1000
    explicit = with_queue_defaults(ServingLimits(max_num_queued_requests=3), 8, 100, 16)
    assert (explicit.max_num_queued_requests, explicit.max_num_queued_tokens) == (3, 3200)


def test_token_budgets() -> None:
    limits = ServingLimits(max_input_tokens=10, max_output_tokens=20)
    with pytest.raises(
        InvalidRequestError,
        match=r"11 tokens, more than .* 10 input tokens \(--max-input-tokens\)"
        r".*truncate_prompt_tokens",
    ):
        apply_token_budgets(core_request(11, 5), SamplingParams(max_tokens=5), limits)
    with pytest.raises(InvalidRequestError, match=r"max_tokens=21 .* limit of 20 output tokens") as caught:
        apply_token_budgets(core_request(5, 21), SamplingParams(max_tokens=21), limits)
    assert caught.value.param == "max_tokens"
    # No max_tokens asked: the rest of the context (resolved to 500 here), capped at the budget.
    capped = apply_token_budgets(core_request(5, 500), SamplingParams(max_tokens=None), limits)
    assert capped.sampling_params.max_tokens == 20
    kept = apply_token_budgets(core_request(5, 7), SamplingParams(max_tokens=7), limits)
    assert kept.sampling_params.max_tokens == 7
    with pytest.raises(InvalidRequestError, match=r"9 samples .* \(--max-num-seqs\)"):
        check_num_samples(SamplingParams(n=9), 8)


def test_deadlines_take_the_smaller_timeout() -> None:
    limits = ServingLimits(max_queue_time=0.05, request_timeout=10.0)
    deadlines = Deadlines.start(limits, 0.2)
    assert deadlines.timeout_s == 0.2 and deadlines.timeout_source == "the request's timeout field"
    assert 0 < deadlines.wait_s(queued=True) <= 0.05 and 0.05 < deadlines.wait_s(queued=False) <= 0.2
    time.sleep(0.06)
    assert deadlines.queue_expired() and not deadlines.expired()
    assert Deadlines.start(limits, 30.0).timeout_source == "--request-timeout"
    assert Deadlines.start(ServingLimits(), None).wait_s(queued=True) is None


def test_stall_watchdog_fires_only_on_a_long_step() -> None:
    fired = threading.Event()
    watchdog = StallWatchdog(0.2, lambda: "state: 1 running", on_stall=fired.set)
    try:
        for _ in range(3):  # quick steps: nothing
            watchdog.step_started()
            time.sleep(0.05)
            watchdog.step_finished()
        time.sleep(0.4)  # idle: nothing either
        assert not fired.is_set()
        watchdog.step_started()  # a step that never ends
        assert fired.wait(2.0)
    finally:
        watchdog.stop()


def test_block_snapshot_shows_owners_shared_and_cached() -> None:
    kv = KVCacheManager(9, KVCacheGroups.uniform(4))
    first = Request(core_request(8, 4, "first"))
    assert kv.allocate_slots(first, 8) is not None
    first.num_computed_tokens = 8
    second = Request(core_request(8, 4, "second"))  # the same prompt: its first full block is cached
    hits = kv.get_computed_blocks(second)
    assert hits and kv.allocate_slots(second, 8 - 4 * len(hits), hits) is not None
    snapshot = snapshot_blocks(kv.block_owners())
    assert snapshot.num_blocks == 8 and snapshot.blocks_per_cell == 1
    assert snapshot.cells.count(SHARED) == len(hits) == snapshot.num_shared_blocks
    assert snapshot.cells.count(1) == 2 - len(hits) and snapshot.cells.count(2) == 2 - len(hits)
    kv.free(first)
    kv.free(second)
    snapshot = snapshot_blocks(kv.block_owners())
    assert snapshot.num_free_blocks == 8 and set(snapshot.cells) <= {FREE, CACHED}
    assert snapshot.cells.count(CACHED) == snapshot.num_cached_blocks >= 1
