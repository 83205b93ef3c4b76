"""--data-parallel-size 2: two engine replicas (processes) behind one frontend, offline and behind a real
server on 127.0.0.1. Each request's tokens are the ones one engine gives; both replicas serve (their
`engine` series count requests); a replica killed mid-flight fails its own requests, the other finishes
its own, /health answers 503 naming the replica."""

import asyncio
import os
import signal
import sys

import httpx
import psutil
import pytest
from server_utils import RemoteServer

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


def test_a_killed_replica_fails_its_requests_only(server: RemoteServer) -> None:
    """Eight streams over both replicas; once each has its first token, replica 0's process is killed."""

    async def run() -> list[BaseException | str]:
        client = server.async_client()
        streams = [
            await client.completions.create(
                model="m",
                prompt=p,
                max_tokens=240,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for p in PROMPTS[:8]
        ]
        firsts = [await stream.__anext__() for stream in streams]
        os.kill(engine_pids(server)[0], signal.SIGKILL)

        async def rest(stream, first) -> BaseException | str:
            text = first.choices[0].text
            try:
                async for chunk in stream:
                    text += chunk.choices[0].text if chunk.choices else ""
            except Exception as exc:  # noqa: BLE001  # the killed replica's requests end in an error
                return exc
            return text

        return await asyncio.gather(*(rest(stream, first) for stream, first in zip(streams, firsts)))

    results = asyncio.run(run())
    failed = [r for r in results if isinstance(r, BaseException)]
    finished = [r for r in results if isinstance(r, str)]
    assert failed and finished, results  # both replicas had requests; only the killed one's fail
    assert all("replica 0" in str(error) for error in failed), failed
    health = httpx.get(server.base_url + "/health", timeout=10)
    assert health.status_code == 503 and "replica 0" in health.text, health.text
