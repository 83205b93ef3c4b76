"""The scheduler with shared blocks (no torch): parallel samples fork from their leader and copy on write,
groups swap out and come back before new requests, preemption modes, and nothing leaks in either pool."""
import pytest

from pagedserve.config import PreemptionMode
from pagedserve.core.request import RequestStatus
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.core.scheduler import Scheduler

from core.utils import make_request, make_scheduler


def sharing_scheduler(num_blocks: int, preemption_mode: PreemptionMode | None = None,
                      block_size: int = 4) -> Scheduler:
    """Small blocks, a 64-token context and 16 host blocks of swap space."""
    return make_scheduler(num_blocks, block_size, max_model_len=64, preemption_mode=preemption_mode,
                          num_host_blocks=16)


def step(scheduler: Scheduler) -> SchedulerOutput:
    """Schedule, then sample token 7 for every request whose tokens were all computed."""
    out = scheduler.schedule()
    sampled = {rid: 7 for rid in out.num_scheduled_tokens
               if scheduler.requests[rid].num_computed_tokens == scheduler.requests[rid].num_tokens}
    scheduler.update_from_output(out, ModelRunnerOutput(sampled))
    return out


def run_to_end(scheduler: Scheduler, max_steps: int = 500) -> list[SchedulerOutput]:
    outputs = []
    while scheduler.has_unfinished_requests() and len(outputs) < max_steps:
        outputs.append(step(scheduler))
    assert not scheduler.has_unfinished_requests(), "every request finishes"
    return outputs


def assert_no_leaks(scheduler: Scheduler) -> None:
    kv, swap = scheduler.kv_cache_manager, scheduler.swap_space
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
    assert len(out.blocks_to_copy) == 2, "two of the three writers of block 1 copy it; the last writes in place"
    assert {new.request_id for new in out.scheduled_new_reqs} == {"0_g", "1_g", "2_g"}, \
        "the leader's table changed mid-table: the workers get it whole"
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
    assert scheduler.num_preemptions_total > 0
    assert any(out.blocks_to_swap_out for out in outputs) is swapped
    assert_no_leaks(scheduler)


def test_a_group_too_large_to_fit_alone_is_recomputed_request_by_request() -> None:
    scheduler = sharing_scheduler(9, block_size=4)  # 8 usable blocks; the group needs 2 x 5 at the end
    for index in range(2):
        scheduler.add_request(make_request(f"{index}_g", 6, 14, group_id="g"))
    outputs = run_to_end(scheduler)
    assert scheduler.num_preemptions_total > 0 and not any(out.blocks_to_swap_out for out in outputs)
    assert_no_leaks(scheduler)
