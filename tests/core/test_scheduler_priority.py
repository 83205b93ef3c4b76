"""--scheduling-policy priority (vLLM's rule): lower `priority` values are admitted first (ties by arrival),
the least urgent running group is preempted first, and a waiting request that cannot get in preempts
running groups of a larger value; fcfs does none of that."""

from utils import make_request, make_scheduler

from pagedserve.core.request import RequestStatus
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.core.urgent_preemption import MAX_YIELDS
from pagedserve.lora.request import LoRARequest


def finish_step(scheduler, token: int = 9) -> list[str]:
    """Schedule one step, sample `token` for every request that samples; the ids scheduled."""
    out = scheduler.schedule()
    scheduler.update_from_output(out, ModelRunnerOutput({rid: token for rid in out.num_scheduled_tokens}))
    return list(out.num_scheduled_tokens)


def test_admission_by_priority_then_arrival() -> None:
    scheduler = make_scheduler(max_num_seqs=1, policy="priority")
    for request_id, priority in [("late-urgent-2", 1), ("lazy", 5), ("urgent-1", -3), ("late-urgent-3", 1)]:
        scheduler.add_request(make_request(request_id, 4, max_tokens=1, priority=priority))
    order = [finish_step(scheduler) for _ in range(4)]
    assert order == [["urgent-1"], ["late-urgent-2"], ["late-urgent-3"], ["lazy"]]


def test_fcfs_admits_in_arrival_order_whatever_the_priority() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    for request_id, priority in [("a", 5), ("b", -3)]:
        scheduler.add_request(make_request(request_id, 4, max_tokens=1, priority=priority))
    assert [finish_step(scheduler) for _ in range(2)] == [["a"], ["b"]]


def test_the_least_urgent_running_request_is_preempted_first() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4, policy="priority")  # 3 usable blocks
    scheduler.add_request(make_request("old-lazy", 4, max_tokens=8, priority=7))
    scheduler.add_request(make_request("new-urgent", 4, max_tokens=8, priority=0))
    finish_step(scheduler)
    out = scheduler.schedule()  # both need a second block, one is free: the lazy one yields
    assert "old-lazy" in out.finished_req_ids and list(out.num_scheduled_tokens) == ["new-urgent"]
    assert scheduler.requests["old-lazy"].status is RequestStatus.PREEMPTED


def test_an_urgent_waiting_request_preempts_a_lazier_running_one() -> None:
    for policy, preempts in [("priority", True), ("fcfs", False)]:
        scheduler = make_scheduler(num_blocks=4, block_size=4, policy=policy)
        scheduler.add_request(make_request("lazy", 8, max_tokens=4, priority=3))
        finish_step(scheduler)  # holds 2 of the 3 blocks (and will need the third)
        scheduler.add_request(make_request("urgent", 8, max_tokens=4, priority=1 if preempts else 0))
        out = scheduler.schedule()
        assert ("lazy" in out.finished_req_ids) == preempts
        assert scheduler.get_stats().num_preemptions_total == int(preempts)
        scheduler.update_from_output(out, ModelRunnerOutput({rid: 9 for rid in out.num_scheduled_tokens}))
        if preempts:
            assert finish_step(scheduler) == ["urgent"]  # admitted the step after


def test_an_equal_priority_never_preempts() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4, policy="priority")
    scheduler.add_request(make_request("first", 8, max_tokens=4, priority=2))
    finish_step(scheduler)
    scheduler.add_request(make_request("second", 8, max_tokens=4, priority=2))
    assert finish_step(scheduler) == ["first"] and scheduler.get_stats().num_preemptions_total == 0


def test_swapped_groups_come_back_most_urgent_first() -> None:
    scheduler = make_scheduler(
        num_blocks=7, block_size=4, policy="priority", num_host_blocks=16, preemption_mode="swap"
    )
    for request_id, priority in [("a", 5), ("b", 1), ("c", 3)]:
        scheduler.add_request(make_request(request_id, 8, max_tokens=12, priority=priority))
    seen: list[list[str]] = []
    while scheduler.has_unfinished_requests() and len(seen) < 60:
        seen.append(finish_step(scheduler))
    assert not scheduler.has_unfinished_requests() and scheduler.get_stats().num_preemptions_total > 0
    finished_order = sorted("abc", key=lambda r: max(i for i, step in enumerate(seen) if r in step))
    assert finished_order == ["b", "c", "a"]


def test_a_preempted_request_goes_back_to_its_place_in_the_queue() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4, policy="priority")  # 3 usable blocks
    scheduler.add_request(make_request("old-lazy", 4, max_tokens=8, priority=7))
    scheduler.add_request(make_request("new-urgent", 4, max_tokens=8, priority=0))
    finish_step(scheduler)
    for request_id, priority in [("waiting-lazier", 9), ("waiting-urgent", 3)]:
        scheduler.add_request(make_request(request_id, 4, max_tokens=1, priority=priority))
    finish_step(scheduler)  # old-lazy is preempted (recompute): back in the queue by its priority
    assert scheduler.get_stats().num_preemptions_total == 1
    assert [r.request_id for r in scheduler.waiting] == ["waiting-urgent", "old-lazy", "waiting-lazier"]


def test_an_urgent_request_goes_before_a_swapped_out_lazier_group_and_the_group_before_lazier_ones() -> None:
    """A sample group (preempted whole, swapped out) gives way to an urgent request once, without coming
    back only to be preempted again; it comes back before a lazier request is admitted."""
    scheduler = make_scheduler(
        num_blocks=7, block_size=4, max_model_len=64, policy="priority", num_host_blocks=16
    )
    for index in range(2):
        scheduler.add_request(make_request(f"{index}_g", 6, max_tokens=6, group_id="g", priority=5))
    finish_step(scheduler)
    assert finish_step(scheduler) == ["0_g", "1_g"]  # the samples forked: the group runs
    scheduler.add_request(make_request("urgent", 12, max_tokens=4, priority=0))
    scheduler.add_request(make_request("lazier", 4, max_tokens=2, priority=9))
    out = scheduler.schedule()
    assert out.blocks_to_swap_out and not out.num_scheduled_tokens  # the group yields, swapped out
    scheduler.update_from_output(out, ModelRunnerOutput({}))
    seen: list[list[str]] = []
    while scheduler.has_unfinished_requests() and len(seen) < 30:
        seen.append(finish_step(scheduler))
    assert seen[:5] == [["urgent"]] * 4 + [["0_g", "1_g"]]  # then the group comes back (swapped in)
    assert any("lazier" in step for step in seen[5:]) and not scheduler.has_unfinished_requests()
    assert scheduler.get_stats().num_preemptions_total == 1
    kv, swap = scheduler.kv_cache_manager, scheduler.kv_cache_manager.swap_space
    assert kv.num_free_blocks() == kv.num_usable_blocks and swap is not None and not swap.tables


def adapter(lora_id: int) -> LoRARequest:
    return LoRARequest(f"a{lora_id}", lora_id, f"/adapters/a{lora_id}")


def test_an_urgent_request_preempts_nobody_while_its_adapter_cannot_get_the_slot() -> None:
    """--max-loras 1: a more urgent request of adapter 1 runs, so preempting the lazy one (adapter 1 too)
    would not free the slot. Nobody is preempted (main preempted and re-admitted it every other step);
    once the urgent one ends, the lazy one yields once and adapter 2's request runs the step after."""
    scheduler = make_scheduler(block_size=4, max_num_seqs=2, policy="priority", max_loras=1)
    scheduler.add_request(make_request("urgent-1", 8, max_tokens=12, priority=0, lora_request=adapter(1)))
    scheduler.add_request(make_request("lazy-1", 8, max_tokens=30, priority=5, lora_request=adapter(1)))
    finish_step(scheduler)
    scheduler.add_request(make_request("urgent-2", 8, max_tokens=4, priority=1, lora_request=adapter(2)))
    seen = [finish_step(scheduler) for _ in range(11)]
    assert seen == [["urgent-1", "lazy-1"]] * 11 and scheduler.get_stats().num_preemptions_total == 0
    assert finish_step(scheduler) == []  # urgent-1 ended: lazy-1 yields its slot
    assert scheduler.get_stats().num_priority_preemptions == 1
    assert finish_step(scheduler) == ["urgent-2"]


def test_the_fewest_groups_that_free_a_slot_are_preempted_not_the_laziest() -> None:
    """The base model's request is lazier but holds no slot: only adapter 1's request yields."""
    scheduler = make_scheduler(block_size=4, policy="priority", max_loras=1)
    scheduler.add_request(make_request("lazy-1", 8, max_tokens=30, priority=3, lora_request=adapter(1)))
    scheduler.add_request(make_request("lazier-base", 8, max_tokens=30, priority=5))
    finish_step(scheduler)
    scheduler.add_request(make_request("urgent-2", 8, max_tokens=4, priority=0, lora_request=adapter(2)))
    out = scheduler.schedule()
    assert out.finished_req_ids == {"lazy-1"} and list(out.num_scheduled_tokens) == ["lazier-base"]
    scheduler.update_from_output(out, ModelRunnerOutput({rid: 9 for rid in out.num_scheduled_tokens}))
    assert finish_step(scheduler) == ["lazier-base", "urgent-2"]
    assert scheduler.get_stats().num_priority_preemptions == 1


def test_no_preemption_in_vain_when_the_blocks_would_still_be_short() -> None:
    """A more urgent request holds most of the pool: even without the lazy one, the urgent waiting one
    would not fit, so the lazy one keeps running (main preempted it and the urgent one waited anyway)."""
    scheduler = make_scheduler(num_blocks=9, block_size=4, policy="priority")  # 8 usable blocks
    scheduler.add_request(make_request("holder", 16, max_tokens=12, priority=0))  # 4 blocks, 1 to grow
    scheduler.add_request(make_request("lazy", 8, max_tokens=12, priority=5, first_token=50))  # 2, 1
    finish_step(scheduler)
    scheduler.add_request(make_request("urgent", 12, max_tokens=4, priority=1, first_token=100))  # 3, 1
    assert finish_step(scheduler) == ["holder", "lazy"]
    assert scheduler.get_stats().num_preemptions_total == 0


def test_the_laziest_groups_that_free_enough_blocks_yield_and_no_more() -> None:
    scheduler = make_scheduler(num_blocks=10, block_size=4, policy="priority")  # 9 usable blocks
    for index, (request_id, priority) in enumerate([("lazy", 4), ("laziest", 6), ("lazier", 5)]):
        scheduler.add_request(make_request(request_id, 8, 12, priority=priority, first_token=50 * index))
    finish_step(scheduler)  # 6 of 9 blocks held, 3 more to grow
    scheduler.add_request(make_request("urgent", 12, max_tokens=4, priority=1, first_token=200))  # 3, 1
    out = scheduler.schedule()
    assert out.finished_req_ids == {"laziest", "lazier"}
    scheduler.update_from_output(out, ModelRunnerOutput({rid: 9 for rid in out.num_scheduled_tokens}))
    assert finish_step(scheduler) == ["lazy", "urgent"]
    assert [scheduler.requests[rid].num_yields for rid in ("laziest", "lazier", "lazy")] == [1, 1, 0]


def test_a_request_yields_at_most_max_yields_times() -> None:
    """Ever more urgent arrivals, one seat: the lazy request yields MAX_YIELDS times, then finishes
    before the next urgent one gets in."""
    scheduler = make_scheduler(max_num_seqs=1, policy="priority")
    lazy = make_request("lazy", 4, max_tokens=6, priority=10)
    scheduler.add_request(lazy)
    finish_step(scheduler)
    for index in range(MAX_YIELDS + 1):
        scheduler.add_request(make_request(f"urgent-{index}", 4, max_tokens=1, priority=-index))
        seen = [finish_step(scheduler) for _ in range(2)]
        if index < MAX_YIELDS:
            assert seen == [[], [f"urgent-{index}"]] and lazy.num_yields == index + 1
            assert finish_step(scheduler) == ["lazy"]  # back: recomputed
    assert seen == [["lazy"], ["lazy"]] and lazy.num_yields == MAX_YIELDS
    while scheduler.has_unfinished_requests():
        finish_step(scheduler)
    assert lazy.status is RequestStatus.FINISHED and lazy.num_output_tokens == 6
