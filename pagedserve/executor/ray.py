"""Ray executor: the same workers as Ray actors, one per rank, placed by a placement group across the
nodes of a running Ray cluster when RAY_ADDRESS names it (`ray start --head` / `ray start --address ...`),
else on a private local Ray instance started for the run with every port on 127.0.0.1. Ray is optional
(pip install 'pagedserve[ray]')
and imported only here, lazily."""

import os
import shutil
import sys
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

from pagedserve.config import EngineConfig
from pagedserve.distributed import DistributedInit, init_distributed_environment
from pagedserve.errors import ConfigError, EngineDeadError
from pagedserve.executor.base import Executor
from pagedserve.executor.failure import GRACE_S, RankFailures, summarize
from pagedserve.logger import init_logger
from pagedserve.platforms import get_platform
from pagedserve.utils.run_dir import make_run_dir
from pagedserve.worker.worker import Worker

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.util.placement_group import PlacementGroup

logger = init_logger(__name__)

_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayWorker:
    """One rank inside a Ray actor: builds its Worker once the group's rendezvous is known."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.worker: Worker | None = None

    def node(self) -> tuple[str, str]:
        """(node id, node IP address) of this actor."""
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        """A TCP port free on this node now (for the rendezvous store of a multi-node group)."""
        import socket

        with socket.socket() as sock:
            sock.bind(("", 0))
            port: int = sock.getsockname()[1]  # (host, port)
            return port

    def init_worker(self, config: EngineConfig, init: DistributedInit) -> None:
        init_distributed_environment(init, self.rank)
        # NOTE: Ray shows each actor only the GPU of its bundle, as device 0.
        self.worker = Worker(config, self.rank, local_rank=0)

    def execute(self, method: str, args: tuple[object, ...], unique_reply_rank: int | None) -> object:
        assert self.worker is not None, "init_worker() first"
        result = getattr(self.worker, method)(*args)
        return result if unique_reply_rank in (None, self.rank) else None


T = TypeVar("T")


class RayExecutor(Executor):
    """Ranks as Ray actors. Failures (a dead actor, a raising rank, a call past --distributed-timeout)
    stop every actor and raise EngineDeadError naming the rank."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.timeout_s = config.parallel.distributed_timeout_s
        self._failure: EngineDeadError | None = None
        size = config.parallel.tensor_parallel_size
        owns_ray = connect_ray(size)  # NOTE: before this module's first `import ray`
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = get_platform(config.device).ray_bundle()
        self._placement_group = ray.util.placement_group([bundle] * size, strategy="PACK")
        self._rendezvous = make_run_dir("tp")
        # NOTE: Any: Ray's ActorHandle types the actor's methods as Never.
        self.actors: list[Any] = []
        self._finalizer = weakref.finalize(
            self, _release, self.actors, self._placement_group, owns_ray, self._rendezvous
        )
        try:
            ray.get(self._placement_group.ready(), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise ConfigError(
                f"The Ray cluster cannot place {size} workers needing {bundle} each within "
                f"--distributed-timeout={self.timeout_s:g}s (available: "
                f"{ray.available_resources()}); add nodes or lower --tensor-parallel-size."
            ) from None
        actor_class = ray.remote(RayWorker)
        for rank in range(size):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self._placement_group, placement_group_bundle_index=rank
            )
            self.actors.append(
                actor_class.options(
                    num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), scheduling_strategy=strategy
                ).remote(rank)
            )
        init = self._distributed_init(config)
        self._gather("startup", [actor.init_worker.remote(config, init) for actor in self.actors])
        logger.info("Started %d tensor-parallel Ray actors (rendezvous %s).", size, init.init_method)

    def _distributed_init(self, config: EngineConfig) -> DistributedInit:
        """A file rendezvous with loopback sockets when every actor is on this node, else a TCP store on
        rank 0's node (multi-node groups need its address reachable from every node)."""
        import ray

        nodes = self._gather("startup", [actor.node.remote() for actor in self.actors])
        backend = get_platform(config.device).dist_backend
        size, timeout = len(self.actors), self.timeout_s
        if all(node_id == ray.get_runtime_context().get_node_id() for node_id, _ in nodes):
            return DistributedInit(
                f"file://{os.path.join(self._rendezvous, 'store')}",
                size,
                backend,
                timeout,
                loopback_only=True,
            )
        port = self._gather("startup", [self.actors[0].free_port.remote()])[0]
        return DistributedInit(f"tcp://{nodes[0][1]}:{port}", size, backend, timeout, loopback_only=False)

    def collective_rpc(
        self, method: str, args: tuple[object, ...] = (), unique_reply_rank: int | None = None
    ) -> list[object]:
        import ray

        if self._failure is not None:
            raise self._failure
        args_ref = ray.put(args)  # NOTE: serialized once into the object store, whatever the rank count
        results = self._gather(
            method, [actor.execute.remote(method, args_ref, unique_reply_rank) for actor in self.actors]
        )
        return results if unique_reply_rank is None else [results[unique_reply_rank]]

    def shutdown(self) -> None:
        self._finalizer()

    def _gather(self, call: str, refs: "list[ObjectRef[T]]") -> list[T]:
        """The result of each ref (ref i belongs to rank i). On a failure or a timeout: name the ranks,
        stop everything, raise."""
        import ray

        try:
            return ray.get(refs, timeout=self.timeout_s)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            pass
        failures = RankFailures(call, self.timeout_s)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=GRACE_S)
        for rank, ref in enumerate(refs):
            if ref in ready:
                _take(ref, rank, failures)
            else:
                failures.silent.append(rank)
        failures.timed_out = not (failures.died or failures.raised)
        self._finalizer()
        error = failures.error()
        self._failure = error if isinstance(error, EngineDeadError) else EngineDeadError(str(error))
        logger.error("%s", error)
        raise error


def _take(ref: "ObjectRef[T]", rank: int, failures: RankFailures) -> None:
    """Record why a finished ref failed (a finished ref that succeeded needs nothing)."""
    import ray

    try:
        ray.get(ref)
    except ray.exceptions.RayActorError as exc:
        failures.died[rank] = f"its Ray actor died: {str(exc).splitlines()[0]}"
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        failures.raised[rank] = summarize(cause)
        if isinstance(cause, ConfigError):
            failures.config_error = cause


def connect_ray(num_workers: int) -> bool:
    """Use this process's Ray, else join the cluster at RAY_ADDRESS (only when asked: a cluster that
    merely runs on this machine may be someone else's), else start a private local instance on
    127.0.0.1 for this run. Returns True when the instance was started here (so shutdown stops it)."""
    address = os.environ.get("RAY_ADDRESS")
    if not address and "ray" not in sys.modules:
        # NOTE: Ray rewrites a 127.0.0.1 node address to the LAN one, and binds its servers there, unless
        # it runs in single-machine mode, which it reads from this variable when first imported.
        os.environ.setdefault(_SINGLE_MACHINE_ENV, "0")
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address)
        logger.info("Joined the Ray cluster at %s (RAY_ADDRESS).", address)
        return False
    if os.environ.get(_SINGLE_MACHINE_ENV) != "0":
        logger.warning(
            "Ray was imported before %s=0 was set: the local Ray instance will listen on this "
            "machine's LAN address. Set it in the environment to keep Ray on 127.0.0.1.",
            _SINGLE_MACHINE_ENV,
        )
    # NOTE: "local": a new instance even when a Ray cluster runs on this machine (ray.init() would join it).
    ray.init(
        address="local",
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        num_cpus=max(num_workers, os.cpu_count() or 1),
    )
    logger.info(
        "Started a private local Ray instance on 127.0.0.1 for %d workers (set RAY_ADDRESS to "
        "join a cluster).",
        num_workers,
    )
    return True


def _release(actors: list[Any], placement_group: "PlacementGroup", owns_ray: bool, rendezvous: str) -> None:
    """Kill the actors, free the placement group, stop a Ray started for the run. Idempotent."""
    import ray

    if ray.is_initialized():
        for actor in actors:
            ray.kill(actor, no_restart=True)
        ray.util.remove_placement_group(placement_group)
        if owns_ray:
            ray.shutdown()
    shutil.rmtree(rendezvous, ignore_errors=True)
