"""KV-aware admission: waiting requests are admitted only while the running ones keep their next blocks,
so an overloaded engine queues instead of thrashing (preempting and recomputing)."""

import random

from core.utils import make_request, make_scheduler

from pagedserve.core.kv_admission import KVAdmissionPolicy
from pagedserve.core.request import Request
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.core.scheduler import Scheduler


class _AdmitAll(KVAdmissionPolicy):
    """The baseline: admit whatever allocate_slots can place."""

    def admits(self, *args: object, **kwargs: object) -> bool:
        return True


def distinct_request(rid: str, prompt_len: int, max_tokens: int) -> Request:
    """Distinct prompts: no prefix-cache hits between them."""
    return make_request(
        rid, prompt_len, max_tokens, first_token=3 + 1000 * (sum(map(ord, rid)) % 40), ignore_eos=True
    )


def run_to_completion(scheduler: Scheduler, max_steps: int = 20_000) -> int:
    """Step with a fake model (token 7 for every finished row) until every request ends; the steps."""
    for step in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return step
        out = scheduler.schedule()
        sampled = {
            rid: 7
            for rid, n in out.num_scheduled_tokens.items()
            if scheduler.requests[rid].num_computed_tokens >= scheduler.requests[rid].num_tokens
        }
        scheduler.update_from_output(out, ModelRunnerOutput(sampled))
    raise AssertionError("the requests did not finish")


def test_waiting_request_leaves_the_running_ones_their_next_block() -> None:
    scheduler = make_scheduler(9, 4, max_model_len=64)  # 8 usable blocks of 4 tokens
    scheduler.add_request(distinct_request("running", 12, 20))  # 3 blocks, then one more every 4 tokens
    scheduler.update_from_output(scheduler.schedule(), ModelRunnerOutput({"running": 7}))
    scheduler.add_request(distinct_request("big", 16, 4))  # 4 blocks now + 1 soon: 5 + 1 reserved > 5 free
    out = scheduler.schedule()
    assert "big" not in out.num_scheduled_tokens and [r.request_id for r in scheduler.waiting] == ["big"]
    scheduler.add_request(distinct_request("small", 4, 4))  # FCFS: it waits behind "big"
    assert "small" not in scheduler.schedule().num_scheduled_tokens
    scheduler.abort_requests(["running"])
    assert set(scheduler.schedule().num_scheduled_tokens) == {"big", "small"}


def test_lone_request_is_always_admitted() -> None:
    scheduler = make_scheduler(5, 4, max_model_len=16)  # exactly one request of 16 tokens
    scheduler.add_request(distinct_request("alone", 15, 1))
    assert scheduler.schedule().num_scheduled_tokens == {"alone": 15}


def test_overload_preempts_far_less_than_admitting_everything() -> None:
    def preemptions(policy: KVAdmissionPolicy) -> tuple[int, int]:
        rng = random.Random(0)
        scheduler = make_scheduler(65, 16, max_num_seqs=16, max_num_batched_tokens=256, admission=policy)
        for i in range(48):  # far more than 64 blocks hold
            scheduler.add_request(distinct_request(f"r{i}", rng.randint(8, 120), rng.randint(8, 120)))
        run_to_completion(scheduler)
        assert scheduler.kv_cache_manager.num_free_blocks() == 64  # every block came back
        return scheduler.preemption.num_preemptions_total, scheduler.preemption.num_recomputed_tokens_total

    admit_all, kv_aware = preemptions(_AdmitAll()), preemptions(KVAdmissionPolicy())
    assert admit_all[0] >= 10 and admit_all[1] > 0
    assert kv_aware[0] * 3 <= admit_all[0] and kv_aware[1] * 3 <= admit_all[1], (kv_aware, admit_all)
