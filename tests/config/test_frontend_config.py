"""The child that resolves the API server's settings waits to become its engine core process; one whose
settings go unused exits as soon as they are dropped (no idle process with torch loaded is left behind)."""

import gc

import psutil

from pagedserve.config.engine import EngineArgs
from pagedserve.config.frontend_config import resolve_frontend_config


def test_an_unused_resolving_process_exits_when_dropped(tiny_llama: str) -> None:
    resolved = resolve_frontend_config(EngineArgs(model=tiny_llama, kv_cache_memory="4MiB"))
    assert resolved.config.model.max_model_len > 0
    child = psutil.Process(resolved.engine_process.pid)
    assert child.is_running() and child.cmdline()[-1] == "EngineCore"  # waiting for the engine to start
    del resolved
    gc.collect()
    assert child.wait(timeout=30) == 0
