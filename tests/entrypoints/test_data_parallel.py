"""--data-parallel-size 2: two engine replicas (processes) behind one frontend, offline and behind a real
server on 127.0.0.1. Each request's tokens are the ones one engine gives; both replicas serve (their
`engine` series count requests); a replica killed mid-flight fails its own requests, the other finishes
its own, /health answers 503 naming the replica."""

import asyncio
import importlib.util
import os
import re
import signal
import subprocess
import sys

import httpx
import psutil
import pytest
from server_utils import RemoteServer, free_port

from pagedserve import LLM, SamplingParams

PROMPTS = [[1, 5 + i, 9, 200 + 7 * i, 17, 44, 80 + i, 3000, 12] for i in range(12)]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
FLAGS = ["--kv-cache-memory", "8MiB", "--max-model-len", "256", "--cpu-threads", "1"]


@pytest.fixture(scope="module")
def expected(tiny_llama: str) -> list[list[int]]:
    llm = LLM(tiny_llama, kv_cache_memory="8MiB", max_model_len=256)
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_offline_replicas_give_one_engines_tokens(tiny_llama: str, expected: list[list[int]]) -> None:
    """LLM(data_parallel_size=2) in a plain script: greedy tokens as one engine's, samples (n=2) and a beam
    search routed whole to one replica (they share KV blocks there)."""
    llm = LLM(tiny_llama, data_parallel_size=2, kv_cache_memory="8MiB", max_model_len=256, cpu_threads=1)
    try:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outputs] == expected
        sampled = llm.generate(
            PROMPTS[:3], SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=6), use_tqdm=False
        )
        assert all(len(o.outputs) == 2 and all(len(s.token_ids) == 6 for s in o.outputs) for o in sampled)
        from pagedserve.sampling_params import BeamSearchParams

        beams = llm.beam_search(
            [{"prompt_token_ids": PROMPTS[0]}], BeamSearchParams(beam_width=2, max_tokens=4)
        )
        assert len(beams[0].sequences) == 2
    finally:
        llm.llm_engine.client.shutdown()


@pytest.fixture(scope="module")
def server(tiny_llama: str):
    args = [tiny_llama, "--served-model-name", "m", "--data-parallel-size", "2", *FLAGS]
    server = RemoteServer([sys.executable, "-m", "pagedserve", "serve"], args)
    yield server
    server.stop()


def metrics_with_engines(server: RemoteServer) -> dict[str, float]:
    """Every sample of /metrics by its full name and labels."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def engine_pids(server: RemoteServer) -> list[int]:
    children = psutil.Process(server.proc.pid).children()
    return [c.pid for c in children if c.cmdline()[-1:] == ["EngineCore"]]


async def _complete_all(server: RemoteServer, prompts: list[list[int]], max_tokens: int = 8) -> list:
    client = server.async_client()
    return await asyncio.gather(
        *(
            client.completions.create(
                model="m", prompt=p, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True}
            )
            for p in prompts
        ),
        return_exceptions=True,
    )


def test_both_replicas_serve_and_give_one_engines_tokens(
    server: RemoteServer, tiny_llama: str, expected
) -> None:
    assert len(engine_pids(server)) == 2
    results = asyncio.run(_complete_all(server, PROMPTS))
    tokenizer_ids = [r.choices[0].text for r in results]
    llm = LLM(tiny_llama, kv_cache_memory="8MiB", max_model_len=256)
    texts = [llm.get_tokenizer().decode(tokens) for tokens in expected]
    assert tokenizer_ids == texts
    samples = metrics_with_engines(server)
    per_engine = {
        engine: sum(
            v
            for k, v in samples.items()
            if k.startswith("vllm:request_success_total") and f'engine="{engine}"' in k
        )
        for engine in ("0", "1")
    }
    assert per_engine["0"] > 0 and per_engine["1"] > 0 and sum(per_engine.values()) == len(PROMPTS), (
        per_engine
    )


async def _streams_with_a_kill(server: RemoteServer, pid: int) -> list[BaseException | str]:
    """Eight streams over both replicas; once each has its first token, process `pid` is killed."""
    client = server.async_client()
    streams = [
        await client.completions.create(
            model="m", prompt=p, max_tokens=240, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        for p in PROMPTS[:8]
    ]
    firsts = [await stream.__anext__() for stream in streams]
    os.kill(pid, signal.SIGKILL)

    async def rest(stream, first) -> BaseException | str:
        text = first.choices[0].text
        try:
            async for chunk in stream:
                text += chunk.choices[0].text if chunk.choices else ""
        except Exception as exc:  # noqa: BLE001  # the killed replica's requests end in an error
            return exc
        return text

    return await asyncio.gather(*(rest(stream, first) for stream, first in zip(streams, firsts)))


def test_a_killed_replica_fails_its_requests_only(server: RemoteServer) -> None:
    results = asyncio.run(_streams_with_a_kill(server, engine_pids(server)[0]))
    failed = [r for r in results if isinstance(r, BaseException)]
    finished = [r for r in results if isinstance(r, str)]
    assert failed and finished, results  # both replicas had requests; only the killed one's fail
    assert all("replica 0" in str(error) for error in failed), failed
    health = httpx.get(server.base_url + "/health", timeout=10)
    assert health.status_code == 503 and "replica 0" in health.text, health.text


# Multi-node data parallelism, both "nodes" on 127.0.0.1: a head serving the API with rank 0 and a
# `--headless` process with rank 1, joined over TCP with CURVE keys of one shared secret.
SECRET = "s3cret-for-the-two-test-nodes"
SECRET_ENV = {"PAGEDSERVE_DATA_PARALLEL_SECRET": SECRET}


@pytest.fixture(scope="module")
def nodes(tiny_llama: str):
    """(head server, headless process): started in that order's reverse, as an operator may."""
    port = str(free_port())
    multi_node = ["--data-parallel-size", "2", "--data-parallel-size-local", "1"]
    multi_node += ["--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", port]
    headless = subprocess.Popen(
        [sys.executable, "-m", "pagedserve", "serve", tiny_llama, "--headless", *multi_node, *FLAGS]
        + ["--data-parallel-start-rank", "1"],
        env={**os.environ, **SECRET_ENV},
    )
    try:
        head = RemoteServer(
            [sys.executable, "-m", "pagedserve", "serve"],
            [tiny_llama, "--served-model-name", "m", *multi_node, *FLAGS],
            env=SECRET_ENV,
        )
    except BaseException:
        headless.kill()
        raise
    yield head, headless
    head.stop()
    headless.wait(30)


def test_head_and_headless_node_serve_with_one_engines_tokens(nodes, tiny_llama: str, expected) -> None:
    head, headless = nodes
    results = asyncio.run(_complete_all(head, PROMPTS))
    llm_texts = [r.choices[0].text for r in results]
    tokenizer = LLM(tiny_llama, kv_cache_memory="8MiB", max_model_len=256).get_tokenizer()
    assert llm_texts == [tokenizer.decode(tokens) for tokens in expected]
    samples = metrics_with_engines(head)
    per_engine = [
        sum(
            v
            for k, v in samples.items()
            if k.startswith("vllm:request_success_total") and f'engine="{e}"' in k
        )
        for e in ("0", "1")
    ]
    assert min(per_engine) > 0 and sum(per_engine) == len(PROMPTS), per_engine


def test_a_killed_headless_replica_fails_its_requests_only(nodes) -> None:
    head, headless = nodes
    (engine,) = [c for c in psutil.Process(headless.pid).children() if c.cmdline()[-1:] == ["EngineCore"]]
    results = asyncio.run(_streams_with_a_kill(head, engine.pid))
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed and len(failed) < len(results), results
    assert all("replica 1" in str(error) for error in failed), failed
    health = httpx.get(head.base_url + "/health", timeout=10)
    assert health.status_code == 503 and "replica 1" in health.text, health.text


def test_a_peer_with_another_secret_is_refused(tiny_llama: str) -> None:
    """A head's listener and a replica's hello over real TCP sockets: the wrong secret fails CURVE's
    handshake (the replica is told so), the head admits nobody and times out naming the rank and flags;
    the right secret with another rank is refused by the head."""
    from pagedserve.config import EngineArgs
    from pagedserve.engine.dp_auth import CurveKeys
    from pagedserve.engine.dp_headless import ask_head
    from pagedserve.engine.dp_remote import ReplicaHello, ReplicaListener, replica_fingerprint
    from pagedserve.errors import ConfigError

    config = EngineArgs(tiny_llama, max_model_len=256).create_engine_config()
    keys = CurveKeys.from_secret(SECRET)

    async def run() -> tuple[str, str, str]:
        listener = ReplicaListener(config, [1], "127.0.0.1", 0, keys)
        try:

            def hello(secret: str, rank: int) -> str:
                with pytest.raises(ConfigError) as refused:
                    hello = ReplicaHello(rank, replica_fingerprint(config))
                    ask_head("127.0.0.1", listener.port, hello, CurveKeys.from_secret(secret), 5.0)
                return str(refused.value)

            wrong_secret = asyncio.create_task(asyncio.to_thread(hello, "not-" + SECRET, 1))
            wrong_rank = asyncio.create_task(asyncio.to_thread(hello, SECRET, 3))
            with pytest.raises(ConfigError) as missing:
                await listener.accept(4.0, "HOW")
            return await wrong_secret, await wrong_rank, str(missing.value)
        finally:
            listener.shutdown()

    wrong_secret, wrong_rank, missing = asyncio.run(run())
    assert "CURVE handshake failed" in wrong_secret and "PAGEDSERVE_DATA_PARALLEL_SECRET" in wrong_secret
    assert "refused" in wrong_rank and "rank 3" in wrong_rank
    assert "rank(s) 1 did not connect" in missing and "--distributed-timeout" in missing and "HOW" in missing


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(data_parallel_size=2, data_parallel_size_local=3), "--data-parallel-size-local 3 must be"),
        (dict(data_parallel_size=2, data_parallel_size_local=-1), "--data-parallel-size-local -1 must be"),
        (dict(data_parallel_size=65), "--data-parallel-size"),
        (
            dict(data_parallel_size=2, data_parallel_size_local=1, headless=True, data_parallel_start_rank=2),
            "--data-parallel-start-rank 2 + --data-parallel-size-local 1",
        ),
        (
            dict(data_parallel_size=2, data_parallel_size_local=1, headless=True),
            "needs --data-parallel-address",
        ),
        (
            dict(data_parallel_size=2, data_parallel_size_local=0, headless=True, data_parallel_address="h"),
            "set --data-parallel-size-local to at least 1",
        ),
        (dict(data_parallel_size=2, data_parallel_size_local=1), "the head needs --data-parallel-address"),
        (
            dict(data_parallel_size=2, data_parallel_size_local=1, data_parallel_start_rank=1),
            "is for --headless nodes",
        ),
        (dict(data_parallel_size=2, data_parallel_rpc_port=70000), "--data-parallel-rpc-port 70000"),
        (dict(data_parallel_size=2, data_parallel_backend="ray", headless=True), "--headless is for"),
        (
            dict(data_parallel_size=2, data_parallel_backend="ray", data_parallel_size_local=1),
            "--data-parallel-size-local is for",
        ),
    ],
)
def test_data_parallel_flag_extremes_are_refused(tiny_llama: str, settings: dict, message: str) -> None:
    from pagedserve.config import EngineArgs
    from pagedserve.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        EngineArgs(tiny_llama, **settings).create_engine_config()


def test_a_head_without_the_secret_refuses_to_start(tiny_llama: str, monkeypatch) -> None:
    from pagedserve.config import EngineArgs
    from pagedserve.engine.dp_client import DPClient
    from pagedserve.errors import ConfigError

    monkeypatch.setenv("PAGEDSERVE_DATA_PARALLEL_SECRET", "short")
    args = dict(data_parallel_size=2, data_parallel_size_local=1, data_parallel_address="127.0.0.1")
    config = EngineArgs(tiny_llama, **args).create_engine_config()

    async def start() -> None:
        DPClient(config)

    with pytest.raises(ConfigError, match="at least 16 characters in PAGEDSERVE_DATA_PARALLEL_SECRET"):
        asyncio.run(start())


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param(dict(data_parallel_backend="ray"), id="ray"),
        pytest.param(dict(pipeline_parallel_size=2), id="pp2"),
    ],
)
def test_offline_replicas_on_ray_or_of_two_stages_give_one_engines_tokens(
    tiny_llama: str, expected: list[list[int]], settings: dict
) -> None:
    """dp=2 as Ray actors on a private local Ray instance, or dp=2 of tp=1 x pp=2 each (four workers)."""
    if settings.get("data_parallel_backend") == "ray" and importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is an optional extra (pip install 'pagedserve[ray]'), not installed here")
    llm = LLM(
        tiny_llama, data_parallel_size=2, kv_cache_memory="8MiB", max_model_len=256, cpu_threads=1, **settings
    )
    try:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    finally:
        llm.llm_engine.client.shutdown()
