"""The one tensor-parallel group of this process (rank, size) and its collectives."""
import torch
import torch.distributed as dist

_TP_RANK = 0
_TP_WORLD_SIZE = 1


def init_tp_group(rank: int, world_size: int) -> None:
    """Record this process's rank. torch.distributed must already be initialized when world_size > 1."""
    global _TP_RANK, _TP_WORLD_SIZE
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
