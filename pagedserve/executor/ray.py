"""Ray executor: the same workers as Ray actors, one per rank (tp x pp of them), placed by a placement
group across the nodes of a running Ray cluster when RAY_ADDRESS names it (`ray start --head` /
`ray start --address ...`), else on a private local Ray instance started for the run with every port on
127.0.0.1. Ranks are numbered node by node, so each pipeline stage's tensor-parallel group shares a node
wherever the cluster allows. Pipeline micro-batches: a step is sent without waiting and its ObjectRefs
gathered when its output is needed. Ray is optional (pip install 'pagedserve[ray]') and imported only here,
lazily."""

import os
import shutil
import sys
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.distributed import DistributedInit, init_distributed_environment
from pagedserve.errors import ConfigError, EngineDeadError
from pagedserve.executor.base import Executor, StepFuture
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

    def store_address(self) -> tuple[str, int]:
        """This node's IP address and a TCP port free on it now (the rendezvous store of a multi-node
        group)."""
        import socket

        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port: int = sock.getsockname()[1]  # (host, port)
            return ray.util.get_node_ip_address(), port

    def init_worker(self, config: EngineConfig, init: DistributedInit) -> None:
        init_distributed_environment(init, self.rank)
        # NOTE: Ray shows each actor only the GPU of its bundle, as device 0.
        self.worker = Worker(config, self.rank, local_rank=0)

    def execute(self, method: str, args: tuple[object, ...], unique_reply_rank: int | None) -> object:
        assert self.worker is not None, "init_worker() first"
        result = getattr(self.worker, method)(*args)
        return result if unique_reply_rank in (None, self.rank) else None


T = TypeVar("T")


@dataclass
class _RayStep:
    """A step sent to every actor: `result()` gathers their answers (once) and gives the sampler's."""

    gather: Callable[[], ModelRunnerOutput]
    output: ModelRunnerOutput | None = None

    def result(self) -> ModelRunnerOutput:
        if self.output is None:
            self.output = self.gather()
        return self.output


class RayExecutor(Executor):
    """Ranks as Ray actors. Failures (a dead actor, a raising rank, a call past --distributed-timeout)
    stop every actor and raise EngineDeadError naming the rank."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        parallel = config.parallel
        self.timeout_s = parallel.distributed_timeout_s
        self._failure: EngineDeadError | None = None
        owns_ray = connect_ray(parallel.world_size)  # NOTE: before this module's first `import ray`
        import ray

        bundle = get_platform(config.device).ray_bundle()
        # NOTE: PACK fills as few nodes as possible, so a stage's tp ranks can share one (their per-layer
        # all-reduces then stay off the network); SPREAD would scatter them.
        self._placement_group = ray.util.placement_group([bundle] * parallel.world_size, strategy="PACK")
        self._rendezvous = make_run_dir("tp")
        # NOTE: Any: Ray's ActorHandle types the actor's methods as Never.
        self.actors: list[Any] = []
        self._finalizer = weakref.finalize(
            self, _release, self.actors, self._placement_group, owns_ray, self._rendezvous
        )
        self._wait_for_placement(bundle)
        rank_nodes = self._start_actors(bundle, parallel.tensor_parallel_size)
        init = self._distributed_init(config, rank_nodes)
        self._gather("startup", [actor.init_worker.remote(config, init) for actor in self.actors])
        logger.info(
            "Started %d Ray actors (tp=%d x pp=%d) on %d node(s); rendezvous %s.",
            parallel.world_size,
            parallel.tensor_parallel_size,
            parallel.pipeline_parallel_size,
            len(set(rank_nodes)),
            init.init_method,
        )

    def _wait_for_placement(self, bundle: dict[str, float]) -> None:
        """Wait until the cluster has reserved every rank's bundle; raises ConfigError past the timeout."""
        import ray

        try:
            ray.get(self._placement_group.ready(), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise ConfigError(
                f"The Ray cluster cannot place {self.config.parallel.world_size} workers needing {bundle} "
                f"each within --distributed-timeout={self.timeout_s:g}s (available: "
                f"{ray.available_resources()}); add nodes or lower --tensor-parallel-size / "
                "--pipeline-parallel-size."
            ) from None

    def _start_actors(self, bundle: dict[str, float], tp: int) -> list[str]:
        """One actor per rank in the bundle rank_bundles() gives it; returns each rank's node id."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        placed = ray.util.placement_group_table(self._placement_group)["bundles_to_node_id"]
        bundle_nodes = [placed[index] for index in range(len(placed))]
        bundle_of_rank = rank_bundles(bundle_nodes, tp)
        rank_nodes = [bundle_nodes[index] for index in bundle_of_rank]
        straddling = straddling_stages(rank_nodes, tp)
        if straddling:
            logger.warning(
                "The tensor-parallel ranks of pipeline stage(s) %s are on more than one node: each "
                "layer's all-reduce crosses the network. Give every node a multiple of "
                "--tensor-parallel-size=%d GPUs.",
                ", ".join(map(str, straddling)),
                tp,
            )
        actor_class = ray.remote(RayWorker)
        for rank, index in enumerate(bundle_of_rank):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self._placement_group, placement_group_bundle_index=index
            )
            self.actors.append(
                actor_class.options(
                    num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), scheduling_strategy=strategy
                ).remote(rank)
            )
        return rank_nodes

    def _distributed_init(self, config: EngineConfig, rank_nodes: list[str]) -> DistributedInit:
        """A file rendezvous with loopback sockets when every actor is on this node, else a TCP store on
        rank 0's node (multi-node groups need its address reachable from every node)."""
        import ray

        backend = get_platform(config.device).dist_backend
        size, timeout = len(self.actors), self.timeout_s
        if set(rank_nodes) == {ray.get_runtime_context().get_node_id()}:
            return DistributedInit(
                f"file://{os.path.join(self._rendezvous, 'store')}",
                size,
                backend,
                timeout,
                loopback_only=True,
            )
        host, port = self._gather("startup", [self.actors[0].store_address.remote()])[0]
        return DistributedInit(f"tcp://{host}:{port}", size, backend, timeout, loopback_only=False)

    def collective_rpc(
        self, method: str, args: tuple[object, ...] = (), unique_reply_rank: int | None = None
    ) -> list[object]:
        results = self._gather(method, self._submit(method, args, unique_reply_rank))
        return results if unique_reply_rank is None else [results[unique_reply_rank]]

    def _start_step(self, scheduler_output: SchedulerOutput) -> StepFuture:
        """Pipeline micro-batches: the step goes to every actor at once; an actor runs the calls of one
        caller in the order they were submitted, so steps run in order on every rank."""
        refs = self._submit("execute_model", (scheduler_output,), self.sampler_rank)
        return _RayStep(
            lambda: cast(ModelRunnerOutput, self._gather("execute_model", refs)[self.sampler_rank])
        )

    def _submit(
        self, method: str, args: tuple[object, ...], unique_reply_rank: int | None
    ) -> "list[ObjectRef[object]]":
        import ray

        if self._failure is not None:
            raise self._failure
        args_ref = ray.put(args)  # NOTE: serialized once into the object store, whatever the rank count
        return [actor.execute.remote(method, args_ref, unique_reply_rank) for actor in self.actors]

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


def rank_bundles(bundle_nodes: list[str], tp: int) -> list[int]:
    """The placement-group bundle of each rank, from each bundle's node (`bundle_nodes`): numbered node
    by node, so consecutive ranks (a stage's `tp` ranks, then the next stage's) share a node. Nodes
    holding whole tensor-parallel groups (a multiple of `tp` bundles) come first: a group then straddles
    two nodes only where some node holds part of one."""
    first_bundle: dict[str, int] = {}
    for index, node in enumerate(bundle_nodes):
        first_bundle.setdefault(node, index)
    per_node = Counter(bundle_nodes)

    def order(index: int) -> tuple[bool, int]:
        node = bundle_nodes[index]
        return per_node[node] % tp != 0, first_bundle[node]

    return sorted(range(len(bundle_nodes)), key=order)  # NOTE: stable: a node's bundles keep their order


def straddling_stages(rank_nodes: list[str], tp: int) -> list[int]:
    """The pipeline stages whose `tp` ranks (global rank = stage * tp + tp rank) span nodes."""
    stages = range(len(rank_nodes) // tp)
    return [stage for stage in stages if len(set(rank_nodes[stage * tp : (stage + 1) * tp])) > 1]


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
