"""tp=2 on gloo through `LLM`: greedy tokens identical to tp=1, each rank holding only its shard, every
socket on loopback; the parallel flags validated. (Equality through the server: see tests/entrypoints.)"""

import argparse
import importlib.util
from collections.abc import Callable, Iterator

import psutil
import pytest
from tp_utils import ENGINE_ARGS, greedy, inet_sockets, is_loopback, shutdown

from pagedserve import LLM
from pagedserve.config import EngineArgs
from pagedserve.errors import ConfigError
from pagedserve.executor.multiproc import MultiprocExecutor

# llama: GQA, 2 KV heads split 1 per rank; llama-1kv-tied: 1 KV head replicated on both ranks and a
# tied vocab-parallel LM head; qwen2: 1 KV head and q/k/v biases; mixtral: experts split over the ranks.
MODELS = ["llama", "llama-1kv-tied", "qwen2", "mixtral"]
# Also greedy-equal at tp=2: a shared expert and dense layers; sliding windows and soft caps; MLA (heads
# split, the latent replicated); gpt-oss (sinks and biases with its heads and experts split).
MORE_FAMILIES = ["qwen2_moe", "gemma2", "deepseek_v3", "gpt_oss"]
TP = 2


@pytest.fixture(scope="module")
def engine(tiny_model_factory) -> Iterator[Callable[[str, int], LLM]]:
    """engine(model, tp): one LLM per (model, tp), built on first use, shut down after the module."""
    cache: dict[tuple[str, int], LLM] = {}

    def get(name: str, tp: int) -> LLM:
        if (name, tp) not in cache:
            cache[name, tp] = LLM(tiny_model_factory(name), tensor_parallel_size=tp, **ENGINE_ARGS)
        return cache[name, tp]

    yield get
    for llm in cache.values():
        shutdown(llm)


@pytest.mark.sampled
@pytest.mark.parametrize("name", MODELS + MORE_FAMILIES)
def test_tp2_greedy_equals_tp1(engine, name: str) -> None:
    llm = engine(name, TP)
    assert isinstance(llm.llm_engine.engine_core.executor, MultiprocExecutor)
    assert greedy(llm) == greedy(engine(name, 1))


def _expected_shard(name: str, full: tuple[int, ...], hf_config) -> tuple[int, ...]:
    head_dim = hf_config.hidden_size // hf_config.num_attention_heads
    if "norm" in name or name.endswith("mlp.gate.weight"):
        return full  # replicated (norms, the MoE router)
    if name.endswith("experts.w13_weight"):  # every expert's gate/up rows split
        return (full[0], full[1] // TP, full[2])
    if name.endswith("experts.w2_weight"):  # every expert's down columns split
        return (full[0], full[1], full[2] // TP)
    if "qkv_proj" in name:  # q heads split; KV heads split, or replicated when fewer than ranks
        kv_heads = max(hf_config.num_key_value_heads // TP, 1)
        return ((hf_config.num_attention_heads // TP + 2 * kv_heads) * head_dim, *full[1:])
    if name.endswith(("o_proj.weight", "down_proj.weight")):  # row-parallel: input columns split
        return (full[0], full[1] // TP)
    return (full[0] // TP, *full[1:])  # column- and vocab-parallel: output rows split


@pytest.mark.parametrize("name", MODELS)
def test_each_rank_holds_only_its_shard(engine, name: str) -> None:
    full = engine(name, 1).llm_engine.engine_core.executor.collective_rpc("parameter_shapes")[0]
    llm = engine(name, TP)
    per_rank = llm.llm_engine.engine_core.executor.collective_rpc("parameter_shapes")
    hf_config = llm.llm_engine.config.model.hf_config
    assert len(per_rank) == TP
    for shapes in per_rank:
        assert shapes.keys() == full.keys()
        for param, shape in shapes.items():
            assert shape == _expected_shard(param, full[param], hf_config), param
    numel = [sum(_numel(s) for s in shapes.values()) for shapes in per_rank]
    assert all(n < 0.52 * sum(_numel(s) for s in full.values()) for n in numel)


def _numel(shape: tuple[int, ...]) -> int:
    result = 1
    for size in shape:
        result *= size
    return result


def test_workers_only_use_loopback(engine) -> None:
    executor = engine("llama", TP).llm_engine.engine_core.executor
    sockets = inet_sockets([psutil.Process(pid) for pid in executor.worker_pids()])
    assert sockets, "gloo connects the ranks over TCP"
    for name, local, remote in sockets:
        assert is_loopback(local.ip) and (not remote or is_loopback(remote.ip)), (name, local, remote)


def _config(**kwargs) -> None:
    EngineArgs(**kwargs).create_engine_config()


def test_pipeline_parallel_flag_combines_with_tp(tiny_llama: str) -> None:
    """-pp 2 -tp 2: four ranks on the mp executor by default, or on Ray when asked
    (tests/distributed/test_pipeline_parallel.py and test_ray_executor.py run the stages)."""
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    flags = ["--model", tiny_llama, "-pp", "2", "-tp", "2"]
    cases = [([], "mp")]
    if importlib.util.find_spec("ray") is not None:  # an optional extra
        cases.append((["--distributed-executor-backend", "ray"], "ray"))
    for backend_flags, backend in cases:
        args = EngineArgs.from_cli_args(parser.parse_args([*flags, *backend_flags]))
        parallel = args.create_engine_config().parallel
        assert (parallel.world_size, parallel.distributed_executor_backend) == (4, backend)


def test_parallel_flags_validated(tiny_llama: str) -> None:
    with pytest.raises(
        ConfigError,
        match=r"tensor_parallel_size=3 does not divide.*"
        r"num_attention_heads=4.*--tensor-parallel-size",
    ):
        _config(model=tiny_llama, tensor_parallel_size=3)
    with pytest.raises(ConfigError, match="--distributed-executor-backend uni runs one rank"):
        _config(model=tiny_llama, tensor_parallel_size=2, distributed_executor_backend="uni")
    with pytest.raises(ConfigError, match="--distributed-timeout"):
        _config(model=tiny_llama, tensor_parallel_size=2, distributed_timeout=0)
    parallel = EngineArgs(model=tiny_llama, tensor_parallel_size=2).create_engine_config().parallel
    assert parallel.distributed_executor_backend == "mp"  # the default when every rank fits here
