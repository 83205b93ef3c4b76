"""The Ray executor joins a Ray cluster only when asked (RAY_ADDRESS): with a raylet of someone else's
cluster running on this machine and no RAY_ADDRESS, it starts a private local instance and serves."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is an optional extra (pip install 'pagedserve[ray]'), not installed here",
)

_SCRIPT = """
import sys
from pagedserve import LLM, SamplingParams
llm = LLM(sys.argv[1], tensor_parallel_size=2, distributed_executor_backend="ray", kv_cache_memory="4MiB",
          max_model_len=64)
out = llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0].outputs[0]
print("TOKENS", len(out.token_ids))
llm.llm_engine.engine_core.shutdown()
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
