"""Tensor-parallel group state and collectives. At tp=1 every collective is the identity."""
from pagedserve.distributed.parallel_state import (get_tp_rank, get_tp_world_size, init_tp_group,
                                                   tensor_model_parallel_all_gather,
                                                   tensor_model_parallel_all_reduce)

__all__ = ["get_tp_rank", "get_tp_world_size", "init_tp_group", "tensor_model_parallel_all_gather",
           "tensor_model_parallel_all_reduce"]
