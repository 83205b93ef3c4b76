"""A worker on a tiny model: its KV block size and weights agree with sizing.py (the planner's figures are
the engine's), its KV budget comes from the platform, the caches have the layout the backends expect,
and the host swap pool moves blocks exactly."""

import pytest
import torch

from pagedserve.config import EngineArgs, EngineConfig
from pagedserve.config.kv_layout import DTYPE_BYTES
from pagedserve.core.sched_output import SchedulerOutput
from pagedserve.model_shape import ModelShape
from pagedserve.worker.worker import Worker


@pytest.fixture(scope="module")
def config(tiny_model_factory) -> EngineConfig:
    path = tiny_model_factory("qwen2")  # biases in q/k/v and a single KV head
    return EngineArgs(
        model=path, kv_cache_memory="1MiB", block_size=8, max_model_len=128, attention_backend="torch"
    ).create_engine_config()


@pytest.fixture(scope="module")
def worker(config: EngineConfig) -> Worker:
    return Worker(config)


def test_sizes_agree_with_sizing(worker: Worker, config: EngineConfig) -> None:
    shape = ModelShape.from_hf_config(config.model.hf_config, config.model.architecture)
    dtype_bytes = DTYPE_BYTES[config.model.dtype]
    per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype_bytes
    assert worker.model_runner.kv_cache_bytes_per_block() == per_token * 8
    assert config.kv_layout.bytes_per_block == per_token * 8  # what the engine sizes the cache by
    assert worker.weights_bytes == shape.num_parameters(1) * dtype_bytes


def test_budget_comes_from_the_platform(worker: Worker) -> None:
    report = worker.determine_kv_memory()
    assert (report.kv_cache_bytes, report.weights_bytes) == (2**20, worker.weights_bytes)
    assert report.detail == "explicit --kv-cache-memory"


def test_kv_cache_layout_and_swap_moves(worker: Worker, config: EngineConfig) -> None:
    hf = config.model.hf_config
    worker.initialize_kv_cache(num_blocks=6, num_host_blocks=3)
    runner = worker.model_runner
    head_dim = hf.hidden_size // hf.num_attention_heads
    assert len(runner.kv_caches) == hf.num_hidden_layers
    for key, value in runner.kv_caches:
        assert key.shape == value.shape == (6, 8, hf.num_key_value_heads, head_dim)
        assert not key.any() and not value.any()  # finite from the start: padding slots are read
    torch.manual_seed(0)
    before = [(k.clone().normal_(), v.clone().normal_()) for k, v in runner.kv_caches]
    for (key, value), (k0, v0) in zip(runner.kv_caches, before):
        key.copy_(k0)
        value.copy_(v0)
    # Swap block 2 out to host block 1, copy block 4 over block 5; then bring host block 1 back as block 3.
    worker.execute_model(SchedulerOutput([], [], {}, 0, blocks_to_swap_out=[(2, 1)], blocks_to_copy=[(4, 5)]))
    worker.execute_model(SchedulerOutput([], [], {}, 0, blocks_to_swap_in=[(1, 3)]))
    for (key, value), (k0, v0) in zip(runner.kv_caches, before):
        for cache, original in ((key, k0), (value, v0)):
            assert torch.equal(cache[3], original[2]) and torch.equal(cache[5], original[4])
            assert torch.equal(cache[[0, 1, 2, 4]], original[[0, 1, 2, 4]])
