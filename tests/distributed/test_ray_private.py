"""The Ray executor joins a Ray cluster only when asked (RAY_ADDRESS): with a raylet of someone else's
cluster running on this machine and no RAY_ADDRESS, it starts a private local instance on 127.0.0.1
(every socket on loopback), serves tp=2, and stops the instance at shutdown, leaving no process behind."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from tp_utils import alive, is_loopback

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is an optional extra (pip install 'pagedserve[ray]'), not installed here",
)

_SCRIPT = """
import json, sys
import psutil
from pagedserve import LLM, SamplingParams
llm = LLM(sys.argv[1], tensor_parallel_size=2, distributed_executor_backend="ray", kv_cache_memory="4MiB",
          max_model_len=64)
out = llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0].outputs[0]
print("TOKENS", len(out.token_ids))
started = psutil.Process().children(recursive=True)  # Ray's processes and the actors
sockets = []
for process in started:
    try:
        sockets += [(c.laddr.ip, c.raddr.ip if c.raddr else "") for c in process.net_connections(kind="inet")]
    except psutil.NoSuchProcess:
        pass
llm.llm_engine.engine_core.shutdown()
import ray
print("AFTER", json.dumps({"pids": [p.pid for p in started], "sockets": sockets, "ray": ray.is_initialized()}))
"""


def test_a_raylet_on_the_machine_is_not_joined_without_ray_address(tiny_llama: str, tmp_path) -> None:
    # A process named raylet, as every node of a Ray cluster runs (what the executor used to look for).
    raylet = tmp_path / "raylet"
    shutil.copy(shutil.which("sleep"), raylet)
    other_cluster = subprocess.Popen([str(raylet), "600"])
    try:
        env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT, tiny_llama], capture_output=True, text=True, timeout=300, env=env
        )
    finally:
        other_cluster.kill()
        other_cluster.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TOKENS 4" in proc.stdout
    assert "Started a private local Ray instance on 127.0.0.1" in proc.stderr
    after = json.loads(proc.stdout.split("AFTER", 1)[1])
    assert after["sockets"], "Ray's processes talk over TCP"
    for local, remote in after["sockets"]:
        assert is_loopback(local) and (not remote or is_loopback(remote)), (local, remote)
    assert after["ray"] is False, "the instance started for the run is stopped with the engine"
    deadline = time.monotonic() + 20  # NOTE: the script has exited: its processes are no children here
    while alive(after["pids"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert alive(after["pids"]) == []
