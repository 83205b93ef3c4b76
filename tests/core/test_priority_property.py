"""--scheduling-policy priority under hypothesis-drawn streams of priorities, adapters (--max-loras) and
lengths over tiny pools, recompute or swap: every request finishes, none yields to more urgent waiting
ones more than MAX_YIELDS times, and the pools end empty."""

from hypothesis import given, settings
from hypothesis import strategies as st
from utils import make_request, make_scheduler

from pagedserve.core.request import RequestStatus
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.core.urgent_preemption import MAX_YIELDS
from pagedserve.lora.request import LoRARequest

MAX_STEPS = 400

arrival = st.tuples(
    st.integers(0, 16),  # the step it arrives before
    st.integers(0, 6),  # priority
    st.integers(1, 12),  # prompt tokens
    st.integers(1, 16),  # max_tokens
    st.integers(0, 2),  # adapter (0: the base model)
)


@settings(max_examples=60, deadline=None)
@given(
    num_blocks=st.integers(9, 16),
    max_loras=st.sampled_from([None, 1, 2]),
    swap=st.booleans(),
    arrivals=st.lists(arrival, min_size=1, max_size=16),
)
def test_every_request_finishes_having_yielded_at_most_max_yields_times(
    num_blocks: int, max_loras: int | None, swap: bool, arrivals: list[tuple[int, int, int, int, int]]
) -> None:
    scheduler = make_scheduler(
        num_blocks,
        block_size=4,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        max_model_len=32,
        policy="priority",
        max_loras=max_loras,
        num_host_blocks=8 if swap else 0,
        preemption_mode="swap" if swap else None,
    )
    requests = [
        (
            step,
            make_request(
                f"r{index}",
                prompt,
                max_tokens,
                priority=priority,
                first_token=3 + index % 3,  # some prompts share a prefix
                lora_request=LoRARequest(f"a{lora_id}", lora_id, f"/a{lora_id}") if lora_id else None,
            ),
        )
        for index, (step, priority, prompt, max_tokens, lora_id) in enumerate(arrivals)
    ]
    for step in range(MAX_STEPS):
        for request in (request for arrives, request in requests if arrives == step):
            scheduler.add_request(request)
        if step > max(arrives for arrives, _ in requests) and not scheduler.has_unfinished_requests():
            break
        out = scheduler.schedule()
        scheduler.update_from_output(out, ModelRunnerOutput({rid: 9 for rid in out.num_scheduled_tokens}))
    assert not scheduler.has_unfinished_requests()
    assert all(request.status is RequestStatus.FINISHED for _, request in requests)
    assert all(request.num_yields <= MAX_YIELDS for _, request in requests)
    stats, kv = scheduler.get_stats(), scheduler.kv_cache_manager
    assert stats.num_priority_preemptions == sum(request.num_yields for _, request in requests)
    assert kv.num_free_blocks() == kv.num_usable_blocks and (
        kv.swap_space is None or not kv.swap_space.tables
    )
