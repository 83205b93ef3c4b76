"""--max-loras in the scheduler: never more adapters running than slots (the base model takes none), a
request whose adapter has no slot waits while those behind it go on, and the prefix cache never hands one
adapter's blocks to another or to the base model (an adapter is its id and its files' digest)."""

from utils import make_request, make_scheduler

from pagedserve.core.hashing import hash_block_tokens
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.lora.request import LoRARequest


def adapter(i: int, files_digest: str = "") -> LoRARequest:
    return LoRARequest(f"a{i}", i, f"/adapters/a{i}", files_digest=files_digest)


def run_step(scheduler) -> set[int]:
    """One step, every scheduled request sampling token 7; returns the adapter ids of the running requests."""
    output = scheduler.schedule()
    scheduler.update_from_output(output, ModelRunnerOutput({rid: 7 for rid in output.num_scheduled_tokens}))
    return {r.lora_request.lora_int_id for r in scheduler.running if r.lora_request is not None}


def test_at_most_max_loras_adapters_run_and_the_base_model_never_waits() -> None:
    scheduler = make_scheduler(max_num_seqs=8, max_num_batched_tokens=256, max_loras=2)
    ids = [1, 2, 3, 1, 0, 3, 0]
    for i, lora_id in enumerate(ids):
        scheduler.add_request(
            make_request(f"r{i}", 8, max_tokens=3, lora_request=adapter(lora_id) if lora_id else None)
        )
    seen: list[set[int]] = []
    while scheduler.has_unfinished_requests():
        seen.append(run_step(scheduler))
        assert len(seen) < 50
    assert all(len(active) <= 2 for active in seen)
    assert seen[0] == {1, 2}  # r2 (adapter 3) waits; r3 (1) and r4, r6 (base) go on
    assert 3 in set().union(*seen)  # and runs once a slot is free


def test_without_max_loras_every_adapter_runs_at_once() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=256)
    for i in range(1, 5):
        scheduler.add_request(make_request(f"r{i}", 8, lora_request=adapter(i)))
    assert run_step(scheduler) == {1, 2, 3, 4}


def test_block_hashes_differ_by_adapter_and_no_salt_spells_one() -> None:
    tokens = list(range(16))
    keys = [
        b"",
        adapter(1).identity,
        adapter(2).identity,
        adapter(1, "ab").identity,
        adapter(1, "cd").identity,
    ]
    hashes = [hash_block_tokens(None, tokens, None, key) for key in keys]
    assert len(set(hashes)) == len(keys)
    one = hashes[1]
    assert hash_block_tokens(None, tokens, keys[1].decode("latin-1")) != one
    assert hash_block_tokens(hashes[0], tokens) == hash_block_tokens(hashes[0], tokens, None, b"")


def test_prefix_cache_hits_only_within_one_adapter() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=256)
    prompt = list(range(3, 40))
    first = make_request("first", prompt, lora_request=adapter(1))
    scheduler.add_request(first)
    while scheduler.has_unfinished_requests():
        run_step(scheduler)
    rewritten = adapter(1, "other files")  # the same id, its folder rewritten: another adapter
    for request_id, lora, hits in (
        ("base", None, 0),
        ("other", adapter(2), 0),
        ("rewritten", rewritten, 0),
        ("same", adapter(1), 32),
    ):
        request = make_request(request_id, prompt, lora_request=lora)
        assert (
            scheduler.kv_cache_manager.num_hit_tokens(scheduler.kv_cache_manager.get_computed_blocks(request))
            == hits
        )
