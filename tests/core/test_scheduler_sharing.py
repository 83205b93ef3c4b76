"""The scheduler with shared blocks (no torch): parallel samples fork from their leader and copy on write,
groups swap out and come back before new requests, preemption modes, and nothing leaks in either pool."""

import time

import pytest
from core.utils import make_request, make_scheduler

from pagedserve.config import PreemptionMode
from pagedserve.core.request import Request, RequestStatus
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.core.scheduler import Scheduler
from pagedserve.protocol import EngineCoreRequest, PositionLogprobs
from pagedserve.sampling_params import BeamSearchParams, SamplingParams


def sharing_scheduler(
    num_blocks: int,
    preemption_mode: PreemptionMode | None = None,
    block_size: int = 4,
    num_host_blocks: int = 16,
) -> Scheduler:
    """Small blocks, a 64-token context and (by default) 16 host blocks of swap space."""
    return make_scheduler(
        num_blocks,
        block_size,
        max_model_len=64,
        preemption_mode=preemption_mode,
        num_host_blocks=num_host_blocks,
    )


def step(scheduler: Scheduler) -> SchedulerOutput:
    """Schedule, then sample token 7 for every request whose tokens were all computed."""
    out = scheduler.schedule()
    sampled = {
        rid: 7
        for rid in out.num_scheduled_tokens
        if scheduler.requests[rid].num_computed_tokens == scheduler.requests[rid].num_tokens
    }
    scheduler.update_from_output(out, ModelRunnerOutput(sampled))
    return out


def run_to_end(scheduler: Scheduler, max_steps: int = 500) -> list[SchedulerOutput]:
    outputs = []
    while scheduler.has_unfinished_requests() and len(outputs) < max_steps:
        outputs.append(step(scheduler))
    assert not scheduler.has_unfinished_requests(), "every request finishes"
    return outputs


def assert_no_leaks(scheduler: Scheduler) -> None:
    kv, swap = scheduler.kv_cache_manager, scheduler.kv_cache_manager.swap_space
    assert kv.num_free_blocks() == kv.block_pool.num_usable_blocks and not kv.req_to_blocks
    assert swap is not None and swap.num_free_blocks() == swap.num_blocks and not swap.tables


def test_samples_fork_from_their_leader_and_copy_the_shared_block_on_write() -> None:
    scheduler = sharing_scheduler(32)
    kv = scheduler.kv_cache_manager
    for index in range(3):
        scheduler.add_request(make_request(f"{index}_g", 6, 4, group_id="g"))
    out = step(scheduler)
    assert out.num_scheduled_tokens == {"0_g": 6}, "the leader computes the prompt alone"
    assert scheduler.get_stats().num_waiting_reqs == 2
    out = step(scheduler)
    # The samples share block 0 (full) and block 1 (positions 4-5) and compute position 5 themselves;
    # the leader writes position 6 into block 1 first, so it copies it.
    assert out.num_scheduled_tokens == {"0_g": 1, "1_g": 1, "2_g": 1}
    shared = kv.req_to_blocks["0_g"][0]
    assert shared is kv.req_to_blocks["1_g"][0] is kv.req_to_blocks["2_g"][0] and shared.ref_cnt == 3
    assert len(out.blocks_to_copy) == 2, (
        "two of the three writers of block 1 copy it; the last writes in place"
    )
    assert {new.request_id for new in out.scheduled_new_reqs} == {"0_g", "1_g", "2_g"}, (
        "the leader's table changed mid-table: the workers get it whole"
    )
    tables = {rid: [b.block_id for b in kv.req_to_blocks[rid]] for rid in ("0_g", "1_g", "2_g")}
    assert len({table[1] for table in tables.values()}) == 3
    stats = scheduler.get_stats()
    assert stats.num_shared_blocks == 1 and stats.num_blocks_saved == 2
    run_to_end(scheduler)
    assert_no_leaks(scheduler)


def test_samples_whose_leader_ends_first_compute_the_prompt_themselves() -> None:
    scheduler = sharing_scheduler(32)
    for index in range(2):
        scheduler.add_request(make_request(f"{index}_g", 9, 1, group_id="g"))
    step(scheduler)  # the leader computes its prompt, samples its only token and ends
    out = step(scheduler)
    assert out.num_scheduled_tokens == {"1_g": 1}, "a prefix hit leaves only the last prompt token"
    run_to_end(scheduler)
    assert_no_leaks(scheduler)


def test_a_group_swaps_out_and_returns_before_new_requests() -> None:
    scheduler = sharing_scheduler(13)  # 12 usable blocks: 5 for solo, 9 for the group at the end
    scheduler.add_request(make_request("solo", 8, 12, first_token=100))
    for index in range(2):
        scheduler.add_request(make_request(f"{index}_g", 6, 12, group_id="g"))
    outputs = []
    while not any(out.blocks_to_swap_out for out in outputs):
        outputs.append(step(scheduler))
        assert len(outputs) < 50
    assert {r.request_id for group in scheduler.swapped for r in group} == {"0_g", "1_g"}
    assert all(scheduler.requests[rid].status is RequestStatus.SWAPPED for rid in ("0_g", "1_g"))
    assert scheduler.get_stats().num_swapped_reqs == 2
    scheduler.add_request(make_request("late", 4, 2))
    outputs = run_to_end(scheduler)
    swap_in = next(i for i, out in enumerate(outputs) if out.blocks_to_swap_in)
    late = next(i for i, out in enumerate(outputs) if "late" in out.num_scheduled_tokens)
    assert swap_in <= late, "swapped requests come back before new ones are admitted"
    assert_no_leaks(scheduler)


@pytest.mark.parametrize("mode, swapped", [("recompute", False), ("swap", True)])
def test_preemption_mode(mode: str, swapped: bool) -> None:
    scheduler = sharing_scheduler(7, preemption_mode=mode)  # 6 usable blocks
    scheduler.add_request(make_request("old", 4, 12))
    scheduler.add_request(make_request("new", 4, 12, first_token=100))
    outputs = run_to_end(scheduler)
    assert scheduler.get_stats().num_preemptions_total > 0
    assert any(out.blocks_to_swap_out for out in outputs) is swapped
    assert_no_leaks(scheduler)


def test_a_group_too_large_to_fit_alone_is_recomputed_request_by_request() -> None:
    scheduler = sharing_scheduler(9, block_size=4)  # 8 usable blocks; the group needs 2 x 5 at the end
    for index in range(2):
        scheduler.add_request(make_request(f"{index}_g", 6, 14, group_id="g"))
    outputs = run_to_end(scheduler)
    assert scheduler.get_stats().num_preemptions_total > 0 and not any(
        out.blocks_to_swap_out for out in outputs
    )
    assert_no_leaks(scheduler)


def test_host_block_ids_are_the_workers_rows() -> None:
    """A group that fills the host pool exactly gets host ids 0..N-1, the rows the workers allocate."""
    scheduler = sharing_scheduler(32, num_host_blocks=3)
    kv, swap = scheduler.kv_cache_manager, scheduler.kv_cache_manager.swap_space
    request = make_request("r", 12, 4)  # 3 blocks of 4
    kv.allocate_slots(request, 12)
    pairs = kv.swap_out([request])
    assert pairs is not None and sorted(host for _, host in pairs) == [0, 1, 2]
    assert swap is not None and swap.num_free_blocks() == 0
    kv.discard_swapped(request)
    assert swap.num_free_blocks() == 3


def drive(scheduler: Scheduler, max_steps: int = 100) -> dict[str, tuple[str, int]]:
    """Run to the end (sampling token 7); each step must advance someone. Returns each request's finish
    reason and number of generated tokens."""
    generated: dict[str, int] = {}
    ended: dict[str, tuple[str, int]] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return ended
        out = scheduler.schedule()
        assert not out.is_empty or out.finished_req_ids or out.has_block_ops, "a step advanced nobody"
        sampled = {
            rid: 7
            for rid in out.num_scheduled_tokens
            if scheduler.requests[rid].num_computed_tokens == scheduler.requests[rid].num_tokens
        }
        for output in scheduler.update_from_output(out, ModelRunnerOutput(sampled)):
            generated[output.request_id] = generated.get(output.request_id, 0) + len(output.new_token_ids)
            if output.finished:
                ended[output.request_id] = (str(output.finish_reason), generated[output.request_id])
    raise AssertionError(f"not done after {max_steps} steps")


@pytest.mark.parametrize("group_first", [False, True])
def test_forked_samples_never_block_the_queue(group_first: bool) -> None:
    """8 blocks of 4 tokens, a request (prompt 4, max 8) and an n=2 group (prompt 24, max 8): the forked
    samples used to wait in the queue holding the blocks its head needed, and every step was empty."""
    scheduler = sharing_scheduler(9)  # 8 usable blocks
    single = [make_request("a", 4, 8)]
    group = [make_request(f"{i}_g", 24, 8, group_id="g", first_token=50) for i in range(2)]
    for request in group + single if group_first else single + group:
        scheduler.add_request(request)
    assert drive(scheduler) == {rid: ("length", 8) for rid in ("a", "0_g", "1_g")}
    assert_no_leaks(scheduler)


def test_a_request_that_outgrows_the_whole_pool_ends_with_length() -> None:
    """7 usable blocks hold 28 tokens: the samples (24 + 8) can never be computed whole; they end early
    with finish_reason 'length' instead of waiting forever, and the other request finishes."""
    scheduler = sharing_scheduler(8)
    scheduler.add_request(make_request("a", 4, 8))
    for index in range(2):
        scheduler.add_request(make_request(f"{index}_g", 24, 8, group_id="g", first_token=50))
    ended = drive(scheduler)
    assert ended["a"] == ("length", 8)
    assert {ended["0_g"][0], ended["1_g"][0]} == {"length"} and max(ended["0_g"][1], ended["1_g"][1]) < 8
    assert_no_leaks(scheduler)


def test_max_num_seqs_counts_the_forks_of_every_beam_search() -> None:
    """Two searches of width 3 under --max-num-seqs 4: the second starts only once the first has ended
    (its forks would make 6 running beams)."""
    scheduler = make_scheduler(64, 4, max_num_seqs=4, max_model_len=64)
    for name in ("x", "y"):
        params = SamplingParams(n=3, temperature=0.0, max_tokens=6)
        scheduler.add_request(
            Request(
                EngineCoreRequest(
                    name,
                    [3, 4, 5],
                    params,
                    None,
                    time.time(),
                    beam_search=BeamSearchParams(3, 6, ignore_eos=True),
                )
            )
        )
    most_running, searches_at_once = 0, 0
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        most_running = max(most_running, len(scheduler.running))
        searches_at_once = max(searches_at_once, len({r.group_id for r in scheduler.running}))
        top = PositionLogprobs([3, 4, 5, 6, 7, 8], [-1.0, -1.5, -2.0, -2.5, -3.0, -3.5], rank=1)
        logprobs = {rid: top for rid in out.num_scheduled_tokens}
        scheduler.update_from_output(out, ModelRunnerOutput({rid: 3 for rid in logprobs}, logprobs=logprobs))
    assert most_running == 3 and searches_at_once == 1
