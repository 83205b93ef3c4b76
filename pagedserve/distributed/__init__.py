"""Tensor-parallel group state and collectives. At tp=1 every collective is the identity."""

from pagedserve.distributed.parallel_state import (
    DistributedInit,
    get_tp_rank,
    get_tp_world_size,
    init_distributed_environment,
    init_tp_group,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)

__all__ = [
    "DistributedInit",
    "get_tp_rank",
    "get_tp_world_size",
    "init_distributed_environment",
    "init_tp_group",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
]
