"""How a frontend talks to the EngineCore (vLLM's EngineCoreClient family): `InprocClient` runs the core in
this process (the offline `LLMEngine`), `mp_client.MPClient` in its own process behind ZMQ (the server's
`AsyncLLM`). Sending never waits for the engine, so `Frontend.submit` can admit and enqueue in one call."""

from abc import ABC, abstractmethod

from pagedserve.engine.core import EngineCore
from pagedserve.errors import EngineDeadError
from pagedserve.protocol import EngineCoreOutputs, EngineCoreRequest


class EngineCoreClient(ABC):
    """The frontend's side of an EngineCore: requests and aborts go in, in order, without waiting."""

    @abstractmethod
    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        """Queue `requests` in the engine core. Raises EngineDeadError if it is gone."""

    @abstractmethod
    def abort_requests(self, request_ids: list[str]) -> None:
        """End engine-core requests wherever they are (their KV blocks are freed)."""

    @abstractmethod
    def is_alive(self) -> bool:
        """Whether the engine core can still take requests."""

    @abstractmethod
    def dead_error(self) -> EngineDeadError:
        """Why the engine core is gone, for the caller to raise."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the engine core (idempotent)."""


class InprocClient(EngineCoreClient):
    """The EngineCore in this process, stepped by its caller (the offline engine)."""

    def __init__(self, engine_core: EngineCore) -> None:
        self.engine_core = engine_core
        self._closed = False

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        if self._closed:
            raise self.dead_error()
        for request in requests:
            self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def step(self) -> EngineCoreOutputs:
        """Run one engine step here."""
        return self.engine_core.step()

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.reset_prefix_cache()

    def is_alive(self) -> bool:
        return not self._closed

    def dead_error(self) -> EngineDeadError:
        return EngineDeadError("The engine was shut down; create a new LLM to generate again.")

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine_core.shutdown()
