"""The model pool's policy alone (no processes): LRU eviction of idle models, never a busy one, the count
and memory limits, and keep_alive's clock starting when a model's last request ends."""

import math

import pytest

from pagedserve.entrypoints.openai.residency import ResidencyLimits, ResidencyPolicy
from pagedserve.errors import CapacityError, InvalidRequestError

MB = 2**20


def loaded(policy: ResidencyPolicy, name: str, size: int, now: float, keep_alive: float = 60.0) -> list[str]:
    """Admit `name` and finish its load at `now` (idle afterwards); returns the evicted models."""
    victims = policy.admit(name, size, keep_alive, now)
    policy.end(name, now)
    return victims


def test_the_least_recently_used_idle_model_is_evicted_first():
    policy = ResidencyPolicy(ResidencyLimits(max_loaded_models=2, memory_budget_bytes=0))
    assert loaded(policy, "a", MB, now=0) == []
    assert loaded(policy, "b", MB, now=1) == []
    policy.begin("a", 60, now=2)  # a is used again: b is now the least recently used
    policy.end("a", now=3)
    assert loaded(policy, "c", MB, now=4) == ["b"]
    assert set(policy.residents) == {"a", "c"}


def test_a_busy_model_is_never_evicted():
    policy = ResidencyPolicy(ResidencyLimits(max_loaded_models=2, memory_budget_bytes=0))
    loaded(policy, "a", MB, now=0)
    loaded(policy, "b", MB, now=1)
    policy.begin("a", 60, now=2)  # a request in flight on the least recently used
    assert policy.admit("c", MB, 60, now=3) == ["b"]
    with pytest.raises(CapacityError, match="--max-loaded-models 2"):
        policy.admit("d", MB, 60, now=4)  # a serves, c is still loading: no room
    assert set(policy.residents) == {"a", "c"}


def test_the_memory_budget_evicts_as_many_as_needed_and_refuses_what_never_fits():
    policy = ResidencyPolicy(ResidencyLimits(max_loaded_models=0, memory_budget_bytes=10 * MB))
    loaded(policy, "a", 4 * MB, now=0)
    loaded(policy, "b", 4 * MB, now=1)
    assert loaded(policy, "c", 9 * MB, now=2) == ["a", "b"]
    with pytest.raises(
        InvalidRequestError, match=r"memory budget of 10.00 MiB alone \(--max-loaded-memory\)"
    ) as info:
        policy.admit("huge", 11 * MB, 60, now=3)
    assert info.value.status_code == 507 and set(policy.residents) == {"c"}


def test_keep_alive_runs_from_the_end_of_the_last_request():
    policy = ResidencyPolicy(ResidencyLimits(0, 0))
    loaded(policy, "a", MB, now=0, keep_alive=10)
    assert policy.next_expiry() == 10
    policy.begin("a", 5, now=8)
    assert policy.expired(now=100) == []  # busy: never expires
    policy.end("a", now=20)
    assert policy.expired(now=24.9) == [] and policy.expired(now=25) == ["a"]
    assert policy.residents == {}


def test_keep_alive_zero_unloads_at_once_and_forever_never():
    policy = ResidencyPolicy(ResidencyLimits(0, 0))
    loaded(policy, "now", MB, now=0, keep_alive=0)
    loaded(policy, "never", MB, now=0, keep_alive=math.inf)
    assert policy.expired(now=0) == ["now"]
    assert policy.expired(now=1e12) == [] and policy.next_expiry() == math.inf


def test_a_model_removed_while_serving_ends_its_requests_quietly():
    policy = ResidencyPolicy(ResidencyLimits(0, 0))
    loaded(policy, "a", MB, now=0)
    policy.begin("a", 60, now=1)
    policy.remove("a")  # its engine died
    policy.end("a", now=2)
    assert policy.residents == {}
