"""One way in (engine/frontend.py): a batch of requests is admitted whole or not at all, atomically, so
concurrent submits never exceed the queue limits together; the refused leave nothing behind."""

import dataclasses
import sys
import threading
from collections.abc import Iterator

import msgspec
import pytest

from pagedserve import SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.engine.admission import ServingLimits
from pagedserve.engine.llm_engine import LLMEngine
from pagedserve.engine.request_options import RequestOptions
from pagedserve.errors import CapacityError, InvalidRequestError

NUM_THREADS = 12
BATCH = 2  # prompts per submit
PROMPT_LEN = 10


@pytest.fixture
def fast_thread_switches() -> Iterator[None]:
    """Switch threads every microsecond (instead of 5 ms), so that a check and an enqueue not made in one
    atomic step would interleave with other threads'."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def race(engine: LLMEngine, tag: str) -> tuple[int, int]:
    """NUM_THREADS threads submit a batch each at the same moment: (batches admitted, batches refused)."""
    options = RequestOptions(SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    frontend = engine.frontend
    batches = [
        [
            frontend.process(f"{tag}-{t}-{i}", {"prompt_token_ids": list(range(5, 5 + PROMPT_LEN))}, options)
            for i in range(BATCH)
        ]
        for t in range(NUM_THREADS)
    ]
    barrier = threading.Barrier(NUM_THREADS)
    admitted, refused = [], []

    def submit(batch: list) -> None:
        barrier.wait()
        try:
            frontend.submit(batch)
            admitted.append(batch)
        except CapacityError:
            refused.append(batch)

    threads = [threading.Thread(target=submit, args=(batch,)) for batch in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(admitted), len(refused)


def run_to_end(engine: LLMEngine) -> set[str]:
    finished = set()
    while engine.has_unfinished_requests():
        finished.update(o.request_id for o in engine.step() if o.finished)
    return finished


@pytest.mark.parametrize(
    "limits, max_batches",
    [
        (ServingLimits(max_num_queued_requests=5), 2),  # 5 requests: two batches of 2, never a third
        (ServingLimits(max_num_queued_tokens=7 * PROMPT_LEN), 3),  # 70 tokens: three batches of 20
    ],
)
def test_concurrent_submits_never_exceed_the_queue_limits(
    tiny_llama: str, fast_thread_switches: None, limits: ServingLimits, max_batches: int
) -> None:
    engine = LLMEngine(EngineArgs(model=tiny_llama, block_size=8, kv_cache_memory="8MiB"), limits)
    for round_index in range(5):  # the queue empties as the engine starts them: the limits hold again
        admitted, refused = race(engine, f"r{round_index}")
        assert (admitted, refused) == (max_batches, NUM_THREADS - max_batches)
        queue = engine.frontend.admission
        assert len(queue.queued) == BATCH * max_batches
        assert queue.num_queued_tokens == BATCH * max_batches * PROMPT_LEN
        # The refused batches left nothing in the engine: only the admitted requests run, and all end.
        assert len(run_to_end(engine)) == BATCH * max_batches
        assert not queue.queued and queue.num_queued_tokens == 0
    assert engine.engine_core.get_stats().kv_cache_usage == 0.0


def test_a_batch_with_a_request_id_in_use_is_refused_whole(tiny_llama: str) -> None:
    engine = LLMEngine(EngineArgs(model=tiny_llama, block_size=8, kv_cache_memory="8MiB"))
    options = RequestOptions(SamplingParams(temperature=0.0, max_tokens=2, n=2))
    frontend = engine.frontend
    frontend.submit([frontend.process("a", [5, 6, 7], options)])
    for ids in (["b", "a"], ["c", "c"]):
        with pytest.raises(InvalidRequestError, match="is already in use"):
            frontend.submit([frontend.process(rid, [5, 6, 7], options) for rid in ids])
    assert run_to_end(engine) == {"a"}
    assert not frontend.admission.queued


def test_a_batch_the_engine_refuses_midway_leaves_nothing_behind(tiny_llama: str) -> None:
    """The in-process engine takes the batch's samples one by one: when one fails (here an unresolved
    max_tokens, the frontend's job), the samples it took before are aborted and nothing stays queued."""
    engine = LLMEngine(EngineArgs(model=tiny_llama, block_size=8, kv_cache_memory="8MiB"))
    params = SamplingParams(temperature=0.0, max_tokens=2, n=2)
    frontend = engine.frontend
    first, (text, bad) = (
        frontend.process("first", [5, 6, 7], RequestOptions(params)),
        frontend.process("bad", [5, 6], RequestOptions(params)),
    )
    unresolved = msgspec.structs.replace(bad, sampling_params=dataclasses.replace(params, max_tokens=None))
    with pytest.raises(AssertionError, match="max_tokens is resolved by the frontend"):
        frontend.submit([first, (text, unresolved)])
    assert not engine.has_unfinished_requests() and not frontend.admission.queued
    assert not engine.engine_core.has_unfinished_requests()  # "first"'s samples were taken, then aborted
    frontend.submit([frontend.process("first", [5, 6, 7], RequestOptions(params))])  # its id is free again
    assert run_to_end(engine) == {"first"}
