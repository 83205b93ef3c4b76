"""This process's place among the ranks of one engine (its tensor-parallel group, its pipeline stage),
how they are joined, and their collectives. Global rank = pp_rank * tp + tp_rank: each stage's tp ranks
form a tensor-parallel group; rank r of stage s sends its hidden states to rank r of stage s + 1."""

import os
from dataclasses import dataclass
from datetime import timedelta

import psutil
import torch
import torch.distributed as dist

from pagedserve.config.parallel import PipelineStage

_TP_RANK = 0
_TP_WORLD_SIZE = 1
_TP_GROUP: dist.ProcessGroup | None = None  # None: the world group (one stage)
_RANK = 0
_PP_STAGE: PipelineStage | None = None  # None: one stage holding every layer


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


def init_parallel_groups(rank: int, tp: int, stages: tuple[PipelineStage, ...]) -> None:
    """Record this process's rank, tensor-parallel group and pipeline stage (`stages`: every stage's, in
    order). torch.distributed must already be initialized when there is more than one rank."""
    global _RANK, _TP_RANK, _TP_WORLD_SIZE, _TP_GROUP, _PP_STAGE
    world_size = tp * len(stages)
    assert world_size == 1 or dist.is_initialized(), "init_distributed_environment() must come first"
    _RANK, _TP_RANK, _TP_WORLD_SIZE = rank, rank % tp, tp
    _PP_STAGE = stages[rank // tp]
    _TP_GROUP = None
    if tp > 1 and len(stages) > 1:
        # NOTE: every rank creates every group, in the same order (torch.distributed's rule).
        for stage in range(len(stages)):
            group = dist.new_group(list(range(stage * tp, (stage + 1) * tp)))
            if stage == _PP_STAGE.rank:
                _TP_GROUP = group


def get_pp_stage() -> PipelineStage | None:
    """This rank's pipeline stage; None before init_parallel_groups (a model built outside a worker)."""
    return _PP_STAGE


def send_to_next_stage(tensors: tuple[torch.Tensor, ...]) -> None:
    """Send to the same tp rank of the next stage (the receiver knows the shapes)."""
    for tensor in tensors:
        dist.send(tensor.contiguous(), _RANK + _TP_WORLD_SIZE)


def recv_from_previous_stage(
    count: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """`count` tensors of `shape` from the same tp rank of the previous stage."""
    received = []
    for _ in range(count):
        tensor = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(tensor, _RANK - _TP_WORLD_SIZE)
        received.append(tensor)
    return tuple(received)


def get_tp_rank() -> int:
    return _TP_RANK


def get_tp_world_size() -> int:
    return _TP_WORLD_SIZE


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP_WORLD_SIZE == 1:
        return x
    dist.all_reduce(x, group=_TP_GROUP)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`."""
    if _TP_WORLD_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_WORLD_SIZE)]
    dist.all_gather(parts, x.contiguous(), group=_TP_GROUP)
    return torch.cat(parts, dim=dim)
