"""Several models served by one server (--models-dir, --model NAME=PATH), each in its own engine process,
loaded when a request first names it and unloaded by the residency policy (residency.py: --max-loaded-models,
--max-loaded-memory, keep_alive). The seam every route resolves a model name through: `use(name)` gives
the model's engine and API app for the time of one request (the OpenAI routes and the Ollama routes alike).

Requests for a model that is loading wait for that one load; a load that fails fails its own requests
(503 naming the model) and the next request tries again; an engine that dies is dropped, and the next
request loads it again. The other models keep serving throughout."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from starlette.types import ASGIApp

from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.entrypoints.openai.models_dir import ModelFile, unknown_model
from pagedserve.entrypoints.openai.residency import ResidencyLimits, ResidencyPolicy
from pagedserve.errors import CapacityError, EngineDeadError, PagedServeError
from pagedserve.logger import init_logger

logger = init_logger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    name: str
    engine: AsyncLLM
    app: ASGIApp  # the OpenAI API over this one engine (api_server.build_app)


@dataclass(frozen=True)
class ResidentModel:
    """One loaded (or loading) model, as /api/ps shows it."""

    name: str
    size_bytes: int
    expires_at: float | None  # time.time() when it unloads; None: not while busy, or never (keep_alive -1)


ModelLoader = Callable[[ModelFile], Awaitable[LoadedModel]]


@dataclass(frozen=True)
class LoadWaits:
    """The queue limits on requests waiting for their model to load (the engine's own queue does not
    exist yet): how many per model, and for how long."""

    max_requests: int  # 0: no limit (--max-num-queued-requests)
    max_time_s: float | None  # None: no limit (--max-queue-time)

    def check(self, name: str, num_waiting: int) -> None:
        """Raises CapacityError (503) when `num_waiting` requests already wait for `name`."""
        if self.max_requests and num_waiting >= self.max_requests:
            raise CapacityError(
                f"{num_waiting} requests already wait for the model `{name}` to load, the limit "
                f"(--max-num-queued-requests {self.max_requests}): retry once it has loaded."
            )

    async def wait(self, name: str, loading: "asyncio.Task[LoadedModel]") -> LoadedModel:
        """The load's result (shared: one waiter leaving does not cancel it). Raises CapacityError past
        --max-queue-time."""
        try:
            return await asyncio.wait_for(asyncio.shield(loading), self.max_time_s)
        except TimeoutError:
            raise CapacityError(
                f"The model `{name}` did not load within --max-queue-time {self.max_time_s:g} s; retry."
            ) from None


class ModelPool:
    """Use from the server's event loop. `load` starts a model's engine and builds its app;
    `bytes_beside_weights`: what each loaded model holds besides its weights (its KV cache and swap), which
    the memory budget counts with them."""

    def __init__(
        self,
        models: dict[str, ModelFile],
        limits: ResidencyLimits,
        default_keep_alive_s: float,
        load: ModelLoader,
        load_waits: LoadWaits,
        bytes_beside_weights: int = 0,
    ) -> None:
        self.models = models
        self.bytes_beside_weights = bytes_beside_weights
        self.load_waits = load_waits
        self.policy = ResidencyPolicy(limits)
        self.default_keep_alive_s = default_keep_alive_s
        self._load = load
        self._loaded: dict[str, LoadedModel] = {}
        self._loading: dict[str, asyncio.Task[LoadedModel]] = {}
        self._changed = asyncio.Event()  # a keep-alive started: the reaper recomputes its wait
        self._tasks: set[asyncio.Task[None]] = set()
        self._reaper = asyncio.create_task(self._reap())

    def model_file(self, name: str) -> ModelFile:
        """Raises InvalidRequestError (404) for a name the pool does not serve."""
        found = self.models.get(name)
        if found is None:
            raise unknown_model(name, list(self.models))
        return found

    @contextlib.asynccontextmanager
    async def use(self, name: str, keep_alive_s: float | None = None) -> AsyncIterator[LoadedModel]:
        """The model `name`, loaded first if it is not, kept from unloading until the block ends; then it
        stays `keep_alive_s` (default: --keep-alive) before it may be unloaded. Raises
        InvalidRequestError (404 unknown name, 507 over the memory budget), CapacityError (no room now),
        EngineDeadError (its load failed)."""
        model = self.model_file(name)
        keep_alive = self.default_keep_alive_s if keep_alive_s is None else keep_alive_s
        now = time.monotonic()
        if name in self.policy.residents:
            if name in self._loading:
                self.load_waits.check(name, self.policy.residents[name].in_flight - 1)
            self.policy.begin(name, keep_alive, now)
        else:
            size_bytes = model.size_bytes + self.bytes_beside_weights
            for victim in self.policy.admit(name, size_bytes, keep_alive, now):
                self._unload(victim, "to make room")
            self._loading[name] = asyncio.create_task(self._start(model))
            self.policy.begin(name, keep_alive, now)
        try:
            loaded = self._loaded.get(name)
            yield loaded if loaded is not None else await self.load_waits.wait(name, self._loading[name])
        finally:
            self.policy.end(name, time.monotonic())
            self._changed.set()

    async def _start(self, model: ModelFile) -> LoadedModel:
        """Load `model`; its load counts as one request in flight until it ends."""
        logger.info("Loading the model `%s` from %s.", model.name, model.path)
        start = time.monotonic()
        try:
            loaded = await self._load(model)
        except Exception as exc:
            self.policy.remove(model.name)
            logger.error("The model `%s` failed to load: %s", model.name, exc)
            reason = str(exc) if isinstance(exc, PagedServeError) else repr(exc)
            raise EngineDeadError(
                f"The model `{model.name}` failed to load: {reason} (the other models still serve)."
            ) from exc
        finally:
            self._loading.pop(model.name, None)
        self._loaded[model.name] = loaded
        self.policy.end(model.name, time.monotonic())
        self._spawn(self._drop_when_dead(loaded))
        logger.info("Loaded the model `%s` in %.1f s.", model.name, time.monotonic() - start)
        return loaded

    def unload(self, name: str) -> None:
        """Unload `name` now if it is idle (keep_alive 0 does it through the policy)."""
        if name in self.policy.residents and not self.policy.residents[name].busy:
            self.policy.remove(name)
            self._unload(name, "on request")

    def _unload(self, name: str, why: str) -> None:
        loaded = self._loaded.pop(name, None)
        if loaded is not None:
            logger.info("Unloading the model `%s` (%s).", name, why)
            self._spawn(loaded.engine.stop())

    async def _drop_when_dead(self, loaded: LoadedModel) -> None:
        await loaded.engine.dead_event.wait()
        if self._loaded.get(loaded.name) is loaded:
            logger.error("The model `%s`'s engine died: the next request for it loads it again.", loaded.name)
            self.policy.remove(loaded.name)
            self._unload(loaded.name, "its engine died")

    async def _reap(self) -> None:
        """Unload each idle model when its keep-alive runs out."""
        while True:
            for name in self.policy.expired(time.monotonic()):
                self._unload(name, "keep_alive ran out")
            wait_s = self.policy.next_expiry() - time.monotonic()
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait(), None if wait_s == float("inf") else max(wait_s, 0)
                )

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def resident(self) -> list[ResidentModel]:
        """What is loaded or loading now, and until when (/api/ps)."""
        to_wall = time.time() - time.monotonic()
        return [
            ResidentModel(
                r.name,
                r.size_bytes,
                None if r.expires_at is None or r.expires_at == float("inf") else r.expires_at + to_wall,
            )
            for r in self.policy.residents.values()
        ]

    def loaded(self, name: str) -> LoadedModel | None:
        return self._loaded.get(name)

    # The lifecycle's view (lifecycle.ServedEngine): the pool lives on when one model's engine dies.
    errored = False

    def death_error(self) -> EngineDeadError:
        return EngineDeadError("The model pool does not die with one model's engine.")

    @property
    def num_requests_in_flight(self) -> int:
        return sum(model.engine.num_requests_in_flight for model in self._loaded.values())

    async def abort_all(self, error: Exception) -> int:
        return sum([await model.engine.abort_all(error) for model in list(self._loaded.values())])

    def shutdown(self) -> None:
        """Stop the loads under way and every engine (waiting for their processes to end; an unload under
        way ends at the interpreter's exit at the latest: MPClient's atexit)."""
        self._reaper.cancel()
        for task in self._loading.values():
            task.cancel()
        for model in self._loaded.values():
            model.engine.shutdown()
        self._loaded.clear()
