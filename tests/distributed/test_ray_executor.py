"""The Ray executor on a two-node Ray cluster, both raylets on 127.0.0.1 (ray.cluster_utils, started once
for the module: a start costs seconds), joined as any Ray this process already runs: greedy tokens of pp=3
(uneven stages of a Qwen3 with KV cache groups, 3 actors over the 2 nodes) and tp=2 x pp=2 (one stage per
node, a TCP rendezvous store) equal one process's, with prefix
caching and preemption; each rank holds only its stage; `pagedserve plan` gives the engine's figures; a
killed actor ends the engine naming its rank, and no actor outlives it. test_ray_private.py covers an
executor starting (and stopping) a private instance of its own, at tp=2."""

import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterator

import psutil
import pytest
from pp_utils import NUM_BLOCKS, PP_ENGINE_ARGS, generate_checked, one_process_tokens, prompts, start_engine
from tp_utils import inet_sockets, is_loopback, shutdown

from pagedserve import LLM, SamplingParams
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.errors import EngineDeadError
from pagedserve.executor.failure import GRACE_S
from pagedserve.executor.ray import RayExecutor, rank_bundles, straddling_stages

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is an optional extra (pip install 'pagedserve[ray]'), not installed here",
)

CPUS_PER_NODE = 2  # a placement bundle per rank takes one: tp=2 x pp=2 needs both nodes
# NOTE: far above how fast a death must be seen, so a failure found only by the timeout fails the test.
TIMEOUT_S = 60.0

one_process = pytest.fixture(scope="module", name="one_process")(one_process_tokens)


@pytest.fixture(scope="module")
def two_node_ray() -> Iterator[None]:
    """Two Ray nodes (raylets) on 127.0.0.1, this process connected to the first."""
    # NOTE: before Ray's import, which reads it: single-machine mode keeps the nodes on 127.0.0.1.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    import ray
    from ray.cluster_utils import Cluster

    node = dict(num_cpus=CPUS_PER_NODE, node_ip_address="127.0.0.1")
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    ray.init(address=cluster.address)
    yield
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.parametrize(
    ("name", "tp", "pp", "nodes", "victim"),
    [
        ("qwen3-4l", 1, 3, 2, 0),  # uneven stages (layers 0 | 1-2 | 3), KV cache groups, 3 actors on 2 nodes
        ("llama-5l-tied", 2, 2, 2, 1),  # a stage per node, its tp group inside it
    ],
)
def test_ray_greedy_equals_one_process_until_a_rank_is_killed(
    two_node_ray,
    one_process,
    tiny_model_factory,
    capsys: pytest.CaptureFixture[str],
    name: str,
    tp: int,
    pp: int,
    nodes: int,
    victim: int,
) -> None:
    expected = one_process(name)
    model = tiny_model_factory(name)
    llm = start_engine(
        model, NUM_BLOCKS[name], tp, pp, distributed_executor_backend="ray", distributed_timeout=TIMEOUT_S
    )
    try:
        executor = llm.llm_engine.engine_core.executor
        assert isinstance(executor, RayExecutor)
        rank_nodes, actors = _placement(executor)
        assert len(set(rank_nodes)) == nodes and straddling_stages(rank_nodes, tp) == []
        tokens, stats = generate_checked(llm)
        assert tokens == expected
        assert stats.num_preemptions_total > 0
        _check_sockets(rank_nodes)
        _check_plan(llm, model, capsys)
        _kill_rank_mid_generation(llm, victim)
    finally:
        shutdown(llm)
    _, still_running = psutil.wait_procs(actors, timeout=20)
    assert [p.pid for p in still_running] == []


def _placement(executor: RayExecutor) -> tuple[list[str], list[psutil.Process]]:
    """Each rank's node id and actor process."""
    import ray

    def where(_: object) -> tuple[str, int]:
        return ray.get_runtime_context().get_node_id(), os.getpid()

    placed = ray.get([actor.__ray_call__.remote(where) for actor in executor.actors])
    return [node for node, _ in placed], [psutil.Process(pid) for _, pid in placed]


def _check_sockets(rank_nodes: list[str]) -> None:
    """Every socket of Ray and the ranks on loopback, but for ranks beyond this process's node their
    rendezvous store, which listens on every interface (the other nodes must reach it)."""
    import ray

    on_this_node = set(rank_nodes) == {ray.get_runtime_context().get_node_id()}
    beyond = [
        (name, local, remote)
        for name, local, remote in inet_sockets(psutil.Process().children(recursive=True))
        if not is_loopback(local.ip) or (remote and not is_loopback(remote.ip))
    ]
    assert len(beyond) == (0 if on_this_node else 1), beyond
    assert all(not remote for _, _, remote in beyond), beyond  # listening only


def _check_plan(llm: LLM, model: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`pagedserve plan` with the engine's settings gives each rank's weights (the largest stage's) and
    bytes per block as the Ray engine has them: nothing in the plan depends on the executor."""
    config, core = llm.llm_engine.config, llm.llm_engine.engine_core
    parallel = config.parallel
    flags = [
        f"--{name.replace('_', '-')}={value}"
        for name, value in {**PP_ENGINE_ARGS, "dtype": config.model.dtype}.items()
    ]
    sizes = ["-tp", str(parallel.tensor_parallel_size), "-pp", str(parallel.pipeline_parallel_size)]
    capsys.readouterr()
    assert cli_main(["plan", model, *flags, *sizes, "--kv-cache-memory", "1MiB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    reports = core.executor.determine_kv_memory()
    assert plan["weights_bytes"] == max(report.weights_bytes for report in reports)
    assert plan["bytes_per_block"] == core.kv_cache_config.bytes_per_block


def _kill_rank_mid_generation(llm: LLM, rank: int) -> None:
    import ray

    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    llm.llm_engine.add_request("running", prompts()[0], params)
    # NOTE: at pp > 1 the first step only sends its micro-batch; the second brings its tokens back.
    assert any(llm.llm_engine.step() for _ in range(2))
    ray.kill(llm.llm_engine.engine_core.executor.actors[rank], no_restart=True)
    start = time.monotonic()
    with pytest.raises(EngineDeadError, match=rf"rank {rank} died \(its Ray actor died"):
        for _ in range(10):  # the kill is asynchronous: a step may still complete first
            llm.llm_engine.step()
    assert time.monotonic() - start < GRACE_S + 10.0, "the death is seen at once, not at the timeout"


@pytest.mark.parametrize(
    ("bundle_nodes", "tp", "bundle_of_rank", "straddling"),
    [
        ("AAAA", 2, [0, 1, 2, 3], []),
        ("ABAB", 2, [0, 2, 1, 3], []),  # ranks are numbered node by node, whatever the bundle order
        ("ABBC", 2, [1, 2, 0, 3], [1]),  # B holds a whole tp group; A and C share the other
        ("AAAB", 2, [0, 1, 2, 3], [1]),
        ("ABAB", 1, [0, 2, 1, 3], []),  # pp only: neighbouring stages share a node
    ],
)
def test_ranks_are_numbered_node_by_node(
    bundle_nodes: str, tp: int, bundle_of_rank: list[int], straddling: list[int]
) -> None:
    nodes = list(bundle_nodes)
    assert rank_bundles(nodes, tp) == bundle_of_rank
    assert straddling_stages([nodes[index] for index in bundle_of_rank], tp) == straddling
