"""Executors run the workers: in this process (uniproc), one process per rank (multiproc), or one Ray
actor per rank (ray). The registry names them without importing them: base.py knows no subclass."""

from typing import TYPE_CHECKING

from pagedserve.config import EngineConfig
from pagedserve.utils.registry import Registry

if TYPE_CHECKING:
    from pagedserve.executor.base import Executor

# --distributed-executor-backend -> executor; config.ExecutorBackend lists the same names.
EXECUTORS: "Registry[Executor]" = Registry("Executor backend", "--distributed-executor-backend")
EXECUTORS.register("uni", "pagedserve.executor.uniproc:UniProcExecutor")
EXECUTORS.register("mp", "pagedserve.executor.multiproc:MultiprocExecutor")
EXECUTORS.register("ray", "pagedserve.executor.ray:RayExecutor")


def get_executor_class(config: EngineConfig) -> "type[Executor]":
    """The executor of --distributed-executor-backend (resolved in the config: uni | mp | ray)."""
    return EXECUTORS.load(config.parallel.distributed_executor_backend)
