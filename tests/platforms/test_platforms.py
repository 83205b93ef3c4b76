"""What each platform decides: device, KV and swap allocation, KV budget, collectives, default backend."""

import os
import subprocess
import sys

import psutil
import pytest
import torch

from pagedserve.config import CacheConfig, ParallelConfig
from pagedserve.errors import ConfigError
from pagedserve.platforms import get_platform
from pagedserve.platforms.cpu import CpuPlatform
from pagedserve.sizing import CPU_DEFAULT_KV_BYTES, MemoryReport, tightest


def test_cpu_platform_choices() -> None:
    platform = get_platform("cpu")
    assert isinstance(platform, CpuPlatform)
    assert (platform.dist_backend, platform.default_attention_backend, platform.ray_bundle()) == (
        "gloo",
        "cpu",
        {"CPU": 1.0},
    )
    assert platform.init_device(0, ParallelConfig()) == torch.device("cpu")


def test_cpu_allocations_start_zeroed_and_writable() -> None:
    platform = CpuPlatform()
    kv = platform.allocate_kv_cache((4, 16, 2, 8), torch.float16, torch.device("cpu"))
    swap = platform.allocate_host_swap((3, 16, 2, 8), torch.float32)
    assert kv.shape == (4, 16, 2, 8) and kv.dtype == torch.float16 and not kv.any()
    assert swap.shape == (3, 16, 2, 8) and not swap.any()
    kv[1] = 1.0
    assert kv.sum().item() == 16 * 2 * 8


def test_cpu_budget_explicit_or_default() -> None:
    platform = CpuPlatform()
    explicit = platform.kv_budget(
        CacheConfig(16, 0.9, 2**20, None), 123, torch.device("cpu"), lambda: None, 0
    )
    assert explicit == MemoryReport(2**20, 123, "explicit --kv-cache-memory")
    default = platform.kv_budget(CacheConfig(16, 0.9, None, None), 0, torch.device("cpu"), lambda: None, 0)
    assert 0 < default.kv_cache_bytes <= CPU_DEFAULT_KV_BYTES


def test_tightest_rank_sizes_every_rank() -> None:
    reports = [MemoryReport(300, 1, "a"), MemoryReport(100, 1, "b"), MemoryReport(200, 1, "c")]
    assert tightest(reports) == MemoryReport(100, 1, "rank 1, the tightest of 3: b")
    assert tightest(reports[:1]) == reports[0]


@pytest.mark.gpu
def test_cuda_platform_pins_swap_and_profiles() -> None:
    platform = get_platform("cuda")
    device = platform.init_device(0, ParallelConfig())
    assert (platform.dist_backend, platform.default_attention_backend) == ("nccl", "torch")
    assert platform.allocate_host_swap((2, 16, 2, 8), torch.float16).is_pinned()
    assert not platform.allocate_kv_cache((2, 16, 2, 8), torch.float16, device).any()
    baseline = platform.memory_baseline(device)
    report = platform.kv_budget(
        CacheConfig(16, 0.5, None, None),
        0,
        device,
        lambda: torch.ones(2**20, device=device).sum().item(),
        baseline,
    )
    assert 0 < report.kv_cache_bytes and "peak activations" in report.detail


PHYSICAL_CORES = min(psutil.cpu_count(logical=False) or os.cpu_count() or 1, len(os.sched_getaffinity(0)))


@pytest.mark.parametrize(
    ("omp", "tp", "flag", "expected"),
    [
        (None, 1, None, PHYSICAL_CORES),
        (None, 2, None, max(1, PHYSICAL_CORES // 2)),
        ("1", 1, None, 1),
        ("1", 1, 3, 3),
        ("18446744073709551616", 1, None, 4096),  # capped, not millions of pool threads
    ],
)
def test_cpu_threads_physical_cores_split_between_ranks_unless_pinned(
    omp: str | None, tp: int, flag: int | None, expected: int
) -> None:
    """--cpu-threads wins, then OMP_NUM_THREADS (a user's pin, as llama.cpp's -t); otherwise the ranks
    share the physical cores."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | (
        {"OMP_NUM_THREADS": omp} if omp else {}
    )
    code = (
        "import torch; from pagedserve.config import ParallelConfig; "
        "from pagedserve.platforms.cpu import CpuPlatform; "
        f"CpuPlatform().init_device(0, ParallelConfig({tp}, 'mp', cpu_threads={flag})); "
        "print(torch.get_num_threads())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) == expected


@pytest.mark.parametrize("threads", [0, -1, 2**63, 2**64])
def test_cpu_threads_out_of_range_is_refused_naming_the_flag(threads: int) -> None:
    with pytest.raises(ConfigError, match="--cpu-threads"):
        ParallelConfig(cpu_threads=threads)
