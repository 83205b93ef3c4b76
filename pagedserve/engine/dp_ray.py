"""--data-parallel-backend ray: Ray places the replicas. Each replica is one Ray actor (in a placement
group of one bundle per replica, each bundle tp x pp ranks' resources) that runs its engine core and
connects back to the head's listener (dp_remote.py) like a --headless node's replica. Ray is joined or
started as the Ray executor does (executor/ray.connect_ray: the cluster at RAY_ADDRESS, else a private
local instance on 127.0.0.1)."""

import os
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pagedserve.config import EngineConfig, ParallelConfig
from pagedserve.engine.dp_auth import CurveKeys
from pagedserve.engine.dp_headless import replica_config, serve_remote_replica
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

logger = init_logger(__name__)


class RayEngineCore:
    """One data-parallel replica inside a Ray actor."""

    def serve(
        self, config: EngineConfig, address: str, port: int, keys: CurveKeys, stall_timeout_s: float
    ) -> None:
        """Runs until the head shuts the replica down (or goes away)."""
        serve_remote_replica(config, address, port, keys, stall_timeout_s)


def listen_address(parallel: ParallelConfig) -> str:
    """Where the head listens for the actors: --data-parallel-address, else this node's address in the
    Ray cluster at RAY_ADDRESS, else 127.0.0.1 (a private local Ray instance)."""
    if parallel.data_parallel_address is not None:
        return parallel.data_parallel_address
    if os.environ.get("RAY_ADDRESS"):
        import ray

        address: str = ray.util.get_node_ip_address()
        return address
    return "127.0.0.1"


class RayReplicas:
    """The replicas' actors and their placement group; `shutdown()` frees them (and a Ray started here)."""

    def __init__(self, config: EngineConfig, stall_timeout_s: float) -> None:
        self.config = config
        self.stall_timeout_s = stall_timeout_s
        self.actors: list[Any] = []  # NOTE: Any: Ray's ActorHandle types the actor's methods as Never
        self.placement_group: PlacementGroup | None = None
        self.owns_ray = False

    def launch(self, address: str, port: int, keys: CurveKeys) -> None:
        """Place one actor per replica and start each serving (they then say hello to the head)."""
        parallel = self.config.parallel
        # NOTE: lazy: the executor and the platform import torch, which the API server's import avoids
        from pagedserve.executor.ray import connect_ray
        from pagedserve.platforms import get_platform

        self.owns_ray = connect_ray(parallel.data_parallel_size * parallel.world_size)
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        rank_bundle = get_platform(self.config.device).ray_bundle()
        bundle = {resource: amount * parallel.world_size for resource, amount in rank_bundle.items()}
        placement_group = ray.util.placement_group([bundle] * parallel.data_parallel_size, strategy="PACK")
        self.placement_group = placement_group
        try:
            ray.get(placement_group.ready(), timeout=parallel.distributed_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(
                f"The Ray cluster cannot place {parallel.data_parallel_size} replicas needing {bundle} each "
                f"within --distributed-timeout={parallel.distributed_timeout_s:g}s (available: "
                f"{ray.available_resources()}); add nodes or lower --data-parallel-size."
            ) from None
        nodes = ray.util.placement_group_table(placement_group)["bundles_to_node_id"]
        per_node = Counter(nodes.values())
        actor_class = ray.remote(RayEngineCore)
        for rank in range(parallel.data_parallel_size):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=placement_group, placement_group_bundle_index=rank
            )
            self.actors.append(
                actor_class.options(
                    num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), scheduling_strategy=strategy
                ).remote()
            )
            config = _placed(self.config, rank, per_node[nodes[rank]])
            # NOTE: serve() runs until the replica stops; its death shows as its connection closing.
            self.actors[-1].serve.remote(config, address, port, keys, self.stall_timeout_s)
        logger.info("Placed %d data-parallel replicas as Ray actors.", len(self.actors))

    def shutdown(self) -> None:
        """Kill the actors, free the placement group, stop a Ray started for the run. Idempotent."""
        import ray

        if not ray.is_initialized():
            return
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors.clear()
        if self.placement_group is not None:
            ray.util.remove_placement_group(self.placement_group)
            self.placement_group = None
        if self.owns_ray:
            ray.shutdown()


def _placed(config: EngineConfig, rank: int, replicas_on_node: int) -> EngineConfig:
    """Rank `rank`'s config on a node Ray gave `replicas_on_node` replicas: they share its cores, and
    (Ray shows each actor only its bundle's GPUs, from device 0) no GPU offset."""
    config = replica_config(config, rank, rank_local=0)
    return replace(config, parallel=replace(config.parallel, data_parallel_size_local=replicas_on_node))
