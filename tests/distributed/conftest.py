"""Fixtures of the distributed tests."""

from collections.abc import Callable

import pytest
from pp_utils import NUM_BLOCKS, run_engine


@pytest.fixture(scope="module")
def one_process(tiny_model_factory) -> Callable[[str], list[list[int]]]:
    """one_process(name): the greedy tokens of pp_utils' workload in one process (uni executor), computed
    once per model and test module."""
    cache: dict[str, list[list[int]]] = {}

    def get(name: str) -> list[list[int]]:
        if name not in cache:
            cache[name], _ = run_engine(tiny_model_factory(name), NUM_BLOCKS[name])
        return cache[name]

    return get
