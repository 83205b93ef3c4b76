"""The server's life: loading -> serving -> draining (SIGTERM) -> stopped, or dead (the engine died).

`ServerLifecycle` is the outermost ASGI app. It answers the probes itself, in every phase:
- `GET /health` (and `/ping`, GET or POST, SageMaker's, as vLLM answers it), as in vLLM: 200 only once
  the engine can serve (draining included: the requests in flight still are); 503 while the model loads
  and once the engine is dead or stalled (the server then exits for a supervisor to restart it). What
  scripts poll before sending; a Kubernetes startupProbe and livenessProbe.
- `GET /ready` (readiness): 200 only while serving; 503 while the model loads, while draining, and
  once the engine is dead. A Kubernetes readinessProbe (a draining replica leaves the Service).
While loading, every other route answers 503 (Retry-After). While draining, new generation requests
(POST /v1/... and /invocations) get 503 and the requests in flight get up to --shutdown-timeout seconds
to finish; the rest are aborted with an error, then the server exits 0.
"""

import asyncio
import enum
import signal
import time
from types import FrameType
from typing import Protocol

import uvicorn
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedserve.entrypoints.openai.errors import error_response
from pagedserve.entrypoints.openai.invocations import INVOCATIONS_PATH
from pagedserve.errors import CapacityError, EngineDeadError
from pagedserve.logger import init_logger

logger = init_logger(__name__)

_LOADING_RETRY_AFTER_S = 5
_DRAIN_POLL_S = 0.1
_FLUSH_S = 0.5  # after aborting: time for the handlers to send their error responses


class ServedEngine(Protocol):
    """What the lifecycle needs of what it serves: an AsyncLLM, or the model pool (--models-dir)."""

    @property
    def errored(self) -> bool: ...

    @property
    def num_requests_in_flight(self) -> int: ...

    def death_error(self) -> EngineDeadError: ...

    async def abort_all(self, error: Exception) -> int: ...


class Phase(enum.Enum):
    LOADING = "loading"
    SERVING = "ready"
    DRAINING = "draining"


class ServerLifecycle:
    """Probes and phase gate in front of the API app (set by `serve()` once the engine is ready)."""

    def __init__(self, shutdown_timeout_s: float) -> None:
        self.shutdown_timeout_s = shutdown_timeout_s
        self.phase = Phase.LOADING
        self.app: ASGIApp | None = None
        self.engine: ServedEngine | None = None
        self._drain_task: asyncio.Task[None] | None = None

    def serve(self, app: ASGIApp, engine: ServedEngine) -> None:
        self.app, self.engine, self.phase = app, engine, Phase.SERVING

    @property
    def dead(self) -> bool:
        return self.engine is not None and self.engine.errored

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if self.app is not None:
                await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in ("/health", "/ping", "/ready"):
            response = self._ready() if path == "/ready" else self._health()
        elif self.phase is Phase.LOADING or self.app is None:
            response = error_response(
                "The server is starting: the model is still loading. Poll GET /health "
                "and send requests once it answers 200.",
                503,
                headers={"Retry-After": str(_LOADING_RETRY_AFTER_S)},
                path=path,
            )
        elif self.phase is Phase.DRAINING and _generates(path) and scope["method"] == "POST":
            response = error_response(
                "The server is shutting down (SIGTERM) and takes no new requests; "
                "send this one to another replica.",
                503,
                headers={"Retry-After": "1", "Connection": "close"},
                path=path,
            )
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)

    def _health(self) -> JSONResponse:
        if self.dead:
            assert self.engine is not None
            why = self.engine.death_error()
            return error_response(f"The engine is dead; the server is shutting down. {why}", 503)
        if self.phase is Phase.LOADING:
            return error_response(
                "Not healthy yet: the model is still loading.",
                503,
                headers={"Retry-After": str(_LOADING_RETRY_AFTER_S)},
            )
        return JSONResponse({"status": self.phase.value})

    def _ready(self) -> JSONResponse:
        if self.dead:
            return error_response("Not ready: the engine is dead; the server is shutting down.", 503)
        if self.phase is Phase.SERVING:
            return JSONResponse({"status": "ready"})
        why = "the model is loading" if self.phase is Phase.LOADING else "the server is shutting down"
        return error_response(f"Not ready: {why}.", 503)

    def start_drain(self, server: uvicorn.Server) -> None:
        """Stop taking requests; let those in flight finish (up to the timeout); then stop `server`."""
        if self.phase is not Phase.SERVING:
            return
        self.phase = Phase.DRAINING
        self._drain_task = asyncio.get_running_loop().create_task(self._drain(server))

    async def _drain(self, server: uvicorn.Server) -> None:
        engine = self.engine
        assert engine is not None, "serving has an engine"
        logger.info(
            "SIGTERM: no new requests; %d in flight get up to %g s to finish (--shutdown-timeout).",
            engine.num_requests_in_flight,
            self.shutdown_timeout_s,
        )
        deadline = time.monotonic() + self.shutdown_timeout_s
        while engine.num_requests_in_flight and time.monotonic() < deadline and not engine.errored:
            await asyncio.sleep(_DRAIN_POLL_S)
        if engine.num_requests_in_flight and not engine.errored:
            error = CapacityError(
                f"The server is shutting down: the request did not finish within "
                f"--shutdown-timeout {self.shutdown_timeout_s:g} s and was aborted; retry it."
            )
            logger.warning(
                "Shutdown: %d request(s) still in flight after %g s are aborted.",
                await engine.abort_all(error),
                self.shutdown_timeout_s,
            )
            await asyncio.sleep(_FLUSH_S)
        else:
            logger.info("Shutdown: every request in flight finished.")
        server.should_exit = True


class LifecycleServer(uvicorn.Server):
    """uvicorn, but SIGTERM while serving drains first (ServerLifecycle) instead of stopping at once.
    A second SIGTERM, or SIGINT (Ctrl-C), stops at once; another SIGINT forces the exit."""

    def __init__(self, config: uvicorn.Config, lifecycle: ServerLifecycle) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the caller before serve()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # NOTE: runs in a signal handler: only thread-safe calls into the event loop.
        if sig == signal.SIGTERM and self.lifecycle.phase is Phase.SERVING and self.loop is not None:
            self.loop.call_soon_threadsafe(self.lifecycle.start_drain, self)
        elif self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


def _generates(path: str) -> bool:
    """A route that starts work on the engine: refused while draining."""
    return path.startswith("/v1/") or path == INVOCATIONS_PATH
