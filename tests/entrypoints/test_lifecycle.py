"""The server's phases without a model: probes while loading, and a drain whose requests outlast
--shutdown-timeout (they are aborted with an error naming it)."""

import asyncio

import httpx

from pagedserve.entrypoints.openai.lifecycle import Phase, ServerLifecycle
from pagedserve.errors import CapacityError


class _StuckEngine:
    """An engine whose one request never finishes."""

    errored = False

    def __init__(self) -> None:
        self.num_requests_in_flight = 1
        self.errors: list[Exception] = []

    async def abort_all(self, error: Exception) -> int:
        self.errors.append(error)
        self.num_requests_in_flight = 0
        return 1


class _Server:
    should_exit = False


def test_probes_while_loading() -> None:
    async def probe() -> list[httpx.Response]:
        lifecycle = ServerLifecycle(1.0)
        transport = httpx.ASGITransport(app=lifecycle)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [
                await client.get("/health"),
                await client.get("/ready"),
                await client.post("/v1/completions", json={}),
            ]

    health, ready, generate = asyncio.run(probe())
    assert health.status_code == 503 and "the model is still loading" in health.json()["error"]["message"]
    assert ready.status_code == 503 and "the model is loading" in ready.json()["error"]["message"]
    assert generate.status_code == 503 and generate.headers["retry-after"] == "5"


def test_drain_aborts_what_outlasts_the_timeout() -> None:
    async def drain() -> tuple[ServerLifecycle, _StuckEngine, _Server]:
        lifecycle, engine, server = ServerLifecycle(0.3), _StuckEngine(), _Server()
        lifecycle.serve(app=None, engine=engine)  # type: ignore[arg-type]
        lifecycle.start_drain(server)  # type: ignore[arg-type]
        assert lifecycle.phase is Phase.DRAINING
        await asyncio.wait_for(lifecycle._drain_task, 5)
        return lifecycle, engine, server

    lifecycle, engine, server = asyncio.run(drain())
    assert server.should_exit and len(engine.errors) == 1 and isinstance(engine.errors[0], CapacityError)
    assert "did not finish within --shutdown-timeout 0.3 s" in str(engine.errors[0])


async def _not_reached(scope: dict, receive: object, send: object) -> None:
    raise AssertionError(f"{scope['method']} {scope['path']} reached the app while draining")


def test_draining_refuses_new_generation_and_answers_the_probes() -> None:
    """While draining, new generation requests (/v1/..., SageMaker's /invocations) get 503 without
    reaching the app; /health and /ping (GET or POST) still answer 200, /ready 503."""

    async def probe() -> list[httpx.Response]:
        lifecycle = ServerLifecycle(5.0)
        lifecycle.serve(app=_not_reached, engine=_StuckEngine())  # type: ignore[arg-type]
        lifecycle.start_drain(_Server())  # type: ignore[arg-type]
        transport = httpx.ASGITransport(app=lifecycle)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            responses = [
                await client.post("/v1/completions", json={}),
                await client.post("/invocations", json={"prompt": "hi"}),
                await client.get("/health"),
                await client.get("/ping"),
                await client.post("/ping"),
                await client.get("/ready"),
            ]
        assert lifecycle._drain_task is not None
        lifecycle._drain_task.cancel()
        return responses

    *refused, health, ping, ping_post, ready = asyncio.run(probe())
    assert all(r.status_code == 503 and "shutting down" in r.json()["error"]["message"] for r in refused)
    assert [health.json(), ping.json(), ping_post.json()] == [{"status": "draining"}] * 3
    assert ready.status_code == 503
