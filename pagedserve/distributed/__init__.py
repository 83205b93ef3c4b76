"""Tensor-parallel group and pipeline-stage state, and their collectives. At tp=1 every collective is
the identity."""

from pagedserve.distributed.parallel_state import (
    DistributedInit,
    get_pp_stage,
    get_tp_rank,
    get_tp_world_size,
    init_distributed_environment,
    init_parallel_groups,
    recv_from_previous_stage,
    send_to_next_stage,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)

__all__ = [
    "DistributedInit",
    "get_pp_stage",
    "get_tp_rank",
    "get_tp_world_size",
    "init_distributed_environment",
    "init_parallel_groups",
    "recv_from_previous_stage",
    "send_to_next_stage",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
]
