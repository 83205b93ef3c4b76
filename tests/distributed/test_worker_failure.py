"""A worker that dies or hangs ends the engine with an EngineDeadError naming the rank, within
--distributed-timeout; no worker outlives the engine, even when the engine process is killed."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from tp_utils import ENGINE_ARGS, alive, make_prompts

from pagedserve import LLM, SamplingParams
from pagedserve.errors import EngineDeadError
from pagedserve.executor.failure import GRACE_S

TIMEOUT_S = 3.0


def _start_generating(path: str) -> tuple[LLM, list[int]]:
    """A tp=2 engine with requests mid-generation, and its workers' pids."""
    llm = LLM(path, tensor_parallel_size=2, distributed_timeout=TIMEOUT_S, **ENGINE_ARGS)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    for index, prompt in enumerate(make_prompts()):
        llm.llm_engine.add_request(f"running-{index}", prompt, params)
    for _ in range(3):
        assert llm.llm_engine.step(), "the requests are running"
    return llm, llm.llm_engine.engine_core.executor.worker_pids()


def _assert_dead_within(llm: LLM, pids: list[int], match: str) -> None:
    start = time.monotonic()
    with pytest.raises(EngineDeadError, match=match):
        llm.llm_engine.step()
    assert time.monotonic() - start < TIMEOUT_S + GRACE_S + 2.0
    assert alive(pids) == [], "every worker is stopped with the engine"
    with pytest.raises(EngineDeadError, match=match):  # later requests fail at once, never hang
        llm.generate(make_prompts()[:1], use_tqdm=False)


def test_killed_worker_ends_engine(tiny_llama: str) -> None:
    llm, pids = _start_generating(tiny_llama)
    os.kill(pids[1], signal.SIGKILL)
    _assert_dead_within(llm, pids, r"rank 1 died \(pid \d+, killed by SIGKILL\)")


def test_hung_worker_ends_engine_after_timeout(tiny_llama: str) -> None:
    llm, pids = _start_generating(tiny_llama)
    os.kill(pids[1], signal.SIGSTOP)  # alive but never answers: rank 0 waits in its all-reduce
    _assert_dead_within(llm, pids, r"rank 1 did not answer")


_ENGINE_SCRIPT = """
import sys, time
from pagedserve import LLM
llm = LLM(sys.argv[1], tensor_parallel_size=2, kv_cache_memory="16MiB", max_model_len=128)
print("ready", flush=True)
time.sleep(600)
"""


def test_workers_die_with_a_killed_engine_process(tiny_llama: str) -> None:
    engine = subprocess.Popen(
        [sys.executable, "-c", _ENGINE_SCRIPT, tiny_llama], stdout=subprocess.PIPE, text=True
    )
    try:
        assert engine.stdout.readline().strip() == "ready"
        descendants = psutil.Process(engine.pid).children(recursive=True)  # the two workers
        assert len(descendants) >= 2
    finally:
        engine.kill()
        engine.wait()
    _, still_running = psutil.wait_procs(descendants, timeout=10)
    assert still_running == []
