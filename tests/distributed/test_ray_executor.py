"""The Ray executor on a local Ray instance bound to 127.0.0.1: greedy tokens identical to tp=1, every
Ray and worker socket on loopback, a killed actor ends the engine naming its rank, and nothing is left
running after shutdown. One test: starting Ray costs seconds."""

import importlib.util
import sys

import psutil
import pytest
from tp_utils import ENGINE_ARGS, greedy, inet_sockets, is_loopback, make_prompts, shutdown

from pagedserve import LLM, SamplingParams
from pagedserve.errors import EngineDeadError
from pagedserve.executor.ray import RayExecutor

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is an optional extra (pip install 'pagedserve[ray]'), not installed here",
)


def test_ray_tp2_greedy_equals_tp1_then_dies_cleanly(tiny_llama: str) -> None:
    # NOTE: ray is not imported before the executor: it sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which
    # Ray reads on import, to keep a local instance on 127.0.0.1.
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    reference = LLM(tiny_llama, **ENGINE_ARGS)
    expected = greedy(reference)
    shutdown(reference)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    llm = LLM(tiny_llama, tensor_parallel_size=2, distributed_executor_backend="ray", **ENGINE_ARGS)
    try:
        assert isinstance(llm.llm_engine.engine_core.executor, RayExecutor)
        assert greedy(llm) == expected
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        sockets = inet_sockets(started)
        assert sockets, "Ray's processes talk over TCP"
        for name, local, remote in sockets:
            assert is_loopback(local.ip) and (not remote or is_loopback(remote.ip)), (name, local, remote)
        _kill_rank_1_mid_generation(llm)
    finally:
        shutdown(llm)
    assert not sys.modules["ray"].is_initialized()
    _, still_running = psutil.wait_procs(started, timeout=20)
    assert [p.pid for p in still_running] == []


def _kill_rank_1_mid_generation(llm: LLM) -> None:
    import ray

    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    llm.llm_engine.add_request("running", make_prompts()[0], params)
    assert llm.llm_engine.step()
    ray.kill(llm.llm_engine.engine_core.executor.actors[1], no_restart=True)
    with pytest.raises(EngineDeadError, match=r"rank 1 died \(its Ray actor died"):
        for _ in range(10):  # the kill is asynchronous: a step may still complete first
            llm.llm_engine.step()
