"""Scheduler behaviour on constructed requests (no torch)."""

from core.utils import make_request, make_scheduler

from pagedserve.core.block_pool import BlockPool
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.protocol import FinishReason


def test_null_block_is_never_allocated() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert 0 not in [b.block_id for b in blocks] and pool.get_num_free_blocks() == 0


def test_chunked_prefill_then_decode_shares_one_budget() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=32)
    scheduler.add_request(make_request("long", 50))
    scheduler.add_request(make_request("short", 5))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"long": 32}  # the budget is spent on the first chunk
    scheduler.update_from_output(out, ModelRunnerOutput({}))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"long": 18, "short": 5}
    scheduler.update_from_output(out, ModelRunnerOutput({"long": 9, "short": 9}))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"long": 1, "short": 1}  # decodes
    assert [c.new_token_ids for c in out.scheduled_cached_reqs] == [[9], [9]]


def test_blocks_grow_one_at_a_time_and_free_at_finish() -> None:
    scheduler = make_scheduler(block_size=8)
    scheduler.add_request(make_request("a", 8, max_tokens=3))
    kv = scheduler.kv_cache_manager
    out = scheduler.schedule()
    assert len(kv.get_block_ids("a")) == 1
    scheduler.update_from_output(out, ModelRunnerOutput({"a": 11}))
    out = scheduler.schedule()
    assert len(kv.get_block_ids("a")) == 2  # the 9th token needs a second block
    scheduler.update_from_output(out, ModelRunnerOutput({"a": 11}))
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"a": 11}))
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    assert kv.num_free_blocks() == 63 and not scheduler.has_unfinished_requests()


def test_preempts_newest_and_resumes_it_first() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4)  # 3 usable blocks
    scheduler.add_request(make_request("old", 4, max_tokens=8))
    scheduler.add_request(make_request("new", 4, max_tokens=8))
    out = scheduler.schedule()
    scheduler.update_from_output(out, ModelRunnerOutput({"old": 9, "new": 9}))
    out = scheduler.schedule()  # both need a second block; only one is free: the newest yields
    assert scheduler.get_stats().num_preemptions_total == 1
    assert "new" in out.finished_req_ids and list(out.num_scheduled_tokens) == ["old"]
    assert scheduler.waiting[0].request_id == "new" and scheduler.waiting[0].num_computed_tokens == 0
    assert scheduler.waiting[0].all_token_ids[-1] == 9, "its sampled token is kept for the recompute"
    scheduler.update_from_output(out, ModelRunnerOutput({"old": 9}))
    scheduler.add_request(make_request("later", 2))
    scheduler.abort_requests(["old"])
    out = scheduler.schedule()  # the preempted request comes back before the later one
    assert [n.request_id for n in out.scheduled_new_reqs][0] == "new"
    assert out.scheduled_new_reqs[0].token_ids[-1] == 9


def test_stop_token_and_min_tokens() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 3, max_tokens=10, min_tokens=2, stop_token_ids=[42]))
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"a": 42}))
    assert outputs[0].finish_reason is None  # under min_tokens: a stop token does not stop
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"a": 42}))
    assert outputs[0].finish_reason is FinishReason.STOP and outputs[0].stop_reason == 42


def test_abort_waiting_and_running_frees_blocks() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    scheduler.add_request(make_request("run", 20))
    scheduler.add_request(make_request("wait", 20))
    scheduler.schedule()
    scheduler.abort_requests(["run", "wait"])
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.num_free_blocks() == 63


def _reported(scheduler, steps: int, tokens: dict[str, int]) -> dict[str, list[tuple[list[int], object]]]:
    """Run `steps` steps sampling tokens[id] + step for each request; each request's outputs as (new tokens,
    finish reason)."""
    reported: dict[str, list[tuple[list[int], object]]] = {request_id: [] for request_id in tokens}
    for step in range(steps):
        out = scheduler.schedule()
        sampled = {request_id: tokens[request_id] + step for request_id in out.num_scheduled_tokens}
        for output in scheduler.update_from_output(out, ModelRunnerOutput(sampled)):
            reported[output.request_id].append((output.new_token_ids, output.finish_reason))
    return reported


def test_a_final_only_request_reports_its_first_token_and_then_its_end() -> None:
    """`final_only` (an offline engine's final-only request): an output for its first token (its time), none
    until it ends, then one with every token since; the request beside it reports every step."""
    scheduler = make_scheduler()
    quiet = make_request("quiet", 4, max_tokens=5)
    quiet.final_only = True
    scheduler.add_request(quiet)
    scheduler.add_request(make_request("loud", 4, max_tokens=5))
    reported = _reported(scheduler, 5, {"quiet": 100, "loud": 200})
    assert reported["quiet"] == [([100], None), ([101, 102, 103, 104], FinishReason.LENGTH)]
    assert reported["loud"] == [([200 + i], None) for i in range(4)] + [([204], FinishReason.LENGTH)]
    assert not scheduler.has_unfinished_requests()


def test_a_final_only_request_cut_short_reports_what_it_had() -> None:
    """Alone in a pool too small for it (3 blocks of 4: 12 tokens), it ends with finish_reason 'length' once
    it cannot grow (13 tokens), and that output carries every token it made since its first."""
    scheduler = make_scheduler(num_blocks=4, block_size=4, enable_caching=False)
    quiet = make_request("quiet", 4, max_tokens=20)
    quiet.final_only = True
    scheduler.add_request(quiet)
    reported = _reported(scheduler, 12, {"quiet": 100})["quiet"]
    assert reported == [([100], None), ([101 + i for i in range(8)], FinishReason.LENGTH)]
