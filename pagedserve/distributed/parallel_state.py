"""The one tensor-parallel group of this process (rank, size), how it is joined, and its collectives."""

import os
from dataclasses import dataclass
from datetime import timedelta

import psutil
import torch
import torch.distributed as dist

_TP_RANK = 0
_TP_WORLD_SIZE = 1


@dataclass(frozen=True)
class DistributedInit:
    """Where and how the ranks of one engine meet. Picklable: the executor sends it to every worker."""

    init_method: str  # file:///... when every rank is on this machine, else tcp://host:port
    world_size: int
    backend: str  # gloo (CPU) | nccl (CUDA)
    timeout_s: float  # a collective that waits longer than this raises (--distributed-timeout)
    loopback_only: bool  # every rank on this machine: no socket may listen beyond 127.0.0.1


def init_distributed_environment(init: DistributedInit, rank: int) -> None:
    """Join the process group as `rank`. Blocks until every rank has joined (or `timeout_s` passes)."""
    if init.loopback_only:
        # NOTE: gloo and NCCL bind their sockets to the interface of the hostname by default, which
        # listens on the LAN; the rendezvous itself is a file, so nothing else opens a port.
        interface = _loopback_interface()
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        os.environ["NCCL_SOCKET_IFNAME"] = interface
    dist.init_process_group(
        init.backend,
        init_method=init.init_method,
        rank=rank,
        world_size=init.world_size,
        timeout=timedelta(seconds=init.timeout_s),
    )


def _loopback_interface() -> str:
    """The name of the interface holding 127.0.0.1 (lo on Linux, lo0 on macOS)."""
    name: str  # psutil is untyped: interface name -> its addresses
    for name, addresses in psutil.net_if_addrs().items():
        if any(address.address == "127.0.0.1" for address in addresses):
            return name
    raise RuntimeError("No network interface holds 127.0.0.1: cannot keep the ranks on loopback.")


def init_tp_group(rank: int, world_size: int) -> None:
    """Record this process's rank. torch.distributed must already be initialized when world_size > 1."""
    global _TP_RANK, _TP_WORLD_SIZE
    assert world_size == 1 or dist.is_initialized(), "init_distributed_environment() must come first"
    _TP_RANK, _TP_WORLD_SIZE = rank, world_size


def get_tp_rank() -> int:
    return _TP_RANK


def get_tp_world_size() -> int:
    return _TP_WORLD_SIZE


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP_WORLD_SIZE == 1:
        return x
    dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`."""
    if _TP_WORLD_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_WORLD_SIZE)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)
