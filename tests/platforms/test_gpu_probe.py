"""The torch-free GPU count (utils/gpu_probe.py) that configuration resolution uses: CUDA_VISIBLE_DEVICES
read as the CUDA runtime reads it, and on a GPU machine the same count as torch's."""

import os
import subprocess
import sys

import pytest

from pagedserve.utils.gpu_probe import _count_visible, visible_gpu_count


@pytest.mark.parametrize(
    ("visible", "count"),
    [
        ("0,1,2,3", 4),
        ("1", 1),
        ("3,1", 2),
        ("", 0),
        ("-1", 0),
        ("0,7,1", 1),  # an index past the GPUs ends the list
        ("0,0", 1),  # and so does a repeated one
        ("GPU-8f2c1e6a-0000,1", 2),
        ("x,0", 0),
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(visible: str, count: int):
    assert _count_visible(visible, installed=4) == count


def test_a_machine_without_the_nvidia_driver_has_no_gpu(monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpu_count() == torch.cuda.device_count()


@pytest.mark.gpu
@pytest.mark.parametrize("visible", [None, "0", "", "0,1,2,3,4,5,6,7,8"])
def test_the_probe_counts_what_torch_counts(visible: str | None):
    """In a fresh process each: CUDA reads CUDA_VISIBLE_DEVICES once, at its initialisation."""
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    code = (
        "import torch; from pagedserve.utils.gpu_probe import visible_gpu_count; "
        "print(visible_gpu_count(), torch.cuda.device_count())"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    probe, counted = run.stdout.split()
    assert probe == counted, visible
