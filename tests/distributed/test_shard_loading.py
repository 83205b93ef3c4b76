"""Each tensor-parallel rank reads only its shard of the checkpoint: two real ranks (gloo, one process
each) load a ~160 MB float32 checkpoint, and each one's peak RSS grows by far less than the file."""

import os
import subprocess
import sys

from conftest import build_tiny_model

# One rank: join the group, load the model, print the peak RSS growth and a checksum of its shard.
_RANK = """
import sys
import psutil, torch
from pagedserve.config import EngineArgs
from pagedserve.distributed import DistributedInit, init_distributed_environment
from pagedserve.distributed.parallel_state import init_parallel_groups
from pagedserve.model_loader.loader import load_model
model, store, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
init_distributed_environment(DistributedInit(f"file://{store}", 2, "gloo", 120, True), rank)
engine = EngineArgs(model=model, dtype="float32").create_engine_config()
init_parallel_groups(rank, 2, engine.kv_layout.stages)
config = engine.model
before = psutil.Process().memory_info().rss
loaded = load_model(config, torch.device("cpu"))
# NOTE: VmHWM, not ru_maxrss, which keeps the peak of the forked parent from before exec.
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM"))
growth = peak - before
down = loaded.model.layers[0].mlp.down_proj.weight
print("RESULT", growth, float(down.double().sum()), tuple(down.shape))
"""


def test_each_rank_reads_only_its_shard(tmp_path) -> None:
    model = build_tiny_model(
        str(tmp_path / "model"),
        "llama",
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=3,
        num_attention_heads=12,
        num_key_value_heads=12,
        vocab_size=8192,
    )
    file_bytes = os.path.getsize(os.path.join(model, "model.safetensors"))
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, model, str(tmp_path / "store"), str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    for proc in ranks:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        line = next(line for line in out.splitlines() if line.startswith("RESULT"))
        growth, checksum, shape = line.split(maxsplit=3)[1:]
        results.append((int(growth), float(checksum), shape))
    for growth, _, shape in results:
        # Its half of the weights plus one slice being read (reading whole tensors costs the whole file more).
        assert growth < 0.75 * file_bytes, (
            f"peak RSS grew {growth / 2**20:.0f} MiB; file {file_bytes / 2**20:.0f} MiB"
        )
        assert shape == "(768, 1536)"  # the row-parallel down_proj: half of its input columns

    from safetensors import safe_open

    with safe_open(os.path.join(model, "model.safetensors"), "pt") as f:
        down = f.get_tensor("model.layers.0.mlp.down_proj.weight").double()
    assert [round(r[1], 6) for r in results] == [
        round(float(down[:, :1536].sum()), 6),
        round(float(down[:, 1536:].sum()), 6),
    ]
