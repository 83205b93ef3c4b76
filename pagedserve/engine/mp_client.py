"""The API server's EngineCoreClient: starts the EngineCore process, sends requests and aborts, receives
outputs (asyncio + ZMQ + msgspec). See core_proc.py for the wire protocol."""

import atexit
import os
import uuid
from abc import abstractmethod

import msgspec
import zmq
import zmq.asyncio

from pagedserve.config import EngineConfig
from pagedserve.engine.core_client import EngineCoreClient
from pagedserve.engine.core_proc import EngineCoreHandshake, run_engine_core
from pagedserve.engine.watchdog import STALL_EXIT_CODE, stall_message
from pagedserve.errors import ConfigError, EngineDeadError, RequestFailedError
from pagedserve.logger import init_logger
from pagedserve.protocol import EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType
from pagedserve.utils.child_process import ChildProcess

logger = init_logger(__name__)

# How long an output wait lasts before checking that the engine process still lives.
_DEATH_CHECK_MS = 200
_SHUTDOWN_TIMEOUT_S = 5.0


class SocketClient(EngineCoreClient):
    """The client's half of the wire protocol over a bound input (PUSH) and output (PULL) socket; the
    subclass says where the engine core runs and whether it lives. Use from one event loop."""

    def __init__(self, input_socket: zmq.asyncio.Socket, output_socket: zmq.asyncio.Socket) -> None:
        self._input_socket = input_socket
        self._output_socket = output_socket
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self._closed = False

    async def _recv(self) -> bytes:
        """The next output message; raises EngineDeadError once the core is gone and nothing is left."""
        while True:
            if await self._output_socket.poll(_DEATH_CHECK_MS):
                try:
                    return await self._output_socket.recv(flags=zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    continue  # NOTE: a readable event without a message (seen over TCP with CURVE)
            elif not self.is_alive():
                raise self.dead_error()

    async def wait_until_ready(self) -> EngineCoreHandshake:
        """Wait (however long loading takes) for the engine to report its KV cache. Raises ConfigError
        for bad settings, EngineDeadError if the process fails otherwise."""
        handshake = msgspec.msgpack.decode(await self._recv(), type=EngineCoreHandshake)
        if handshake.error is not None:
            if handshake.config_error:
                raise ConfigError(handshake.error)
            raise EngineDeadError(f"The engine core failed to start: {handshake.error}")
        return handshake

    async def get_output(self) -> EngineCoreOutputs:
        """The next EngineCoreOutputs. Raises EngineDeadError when the process has died."""
        return self._decoder.decode(await self._recv())

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        """Raises RequestFailedError (nothing sent) when a request cannot be encoded."""
        try:
            payload = self._encoder.encode(requests)
        except Exception as exc:  # TypeError, OverflowError, msgspec.EncodeError: a field of a wrong type
            ids = ", ".join(request.request_id for request in requests)
            raise RequestFailedError(f"Request(s) {ids} could not be encoded for the engine: {exc}") from exc
        self._send(EngineCoreRequestType.ADD, payload)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self._send(EngineCoreRequestType.ABORT, self._encoder.encode(request_ids))

    def reset_prefix_cache(self) -> None:
        """Make the engine forget its cached KV blocks (handled in order with the other inputs)."""
        self._send(EngineCoreRequestType.RESET_PREFIX_CACHE, b"")

    def request_block_snapshot(self) -> None:
        """Ask for the KV block pool's state; it comes back as an output with `block_snapshot` set."""
        self._send(EngineCoreRequestType.BLOCK_SNAPSHOT, b"")

    def sleep(self, level: int) -> None:
        """Free the weights and the KV cache (level 1 or 2); answered by an output with `sleep_level`."""
        self._send(EngineCoreRequestType.SLEEP, self._encoder.encode(level))

    def wake_up(self) -> None:
        """Load them again; answered by an output with `sleep_level` 0."""
        self._send(EngineCoreRequestType.WAKE_UP, b"")

    def _send(self, kind: EngineCoreRequestType, payload: bytes) -> None:
        """Send without waiting (call from the event loop): pyzmq's asyncio socket sends at once when it
        can, else queues the message behind the earlier ones, so the order holds either way."""
        if not self.is_alive():
            raise self.dead_error()
        self._input_socket.send_multipart([kind.value, payload], copy=False)

    @abstractmethod
    def kill(self) -> None:
        """End an unresponsive engine core at once."""

    def request_shutdown(self) -> None:
        """Ask the engine core to stop (without waiting: its queue may be full or gone)."""
        # NOTE: through a synchronous shadow of the socket: an asyncio socket's send needs an event loop,
        # and at interpreter exit (atexit) there is none.
        socket: zmq.Socket[bytes] = zmq.Socket.shadow(self._input_socket.underlying)
        try:
            socket.send_multipart([EngineCoreRequestType.SHUTDOWN.value, b""], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the caller ends it otherwise

    def close(self) -> None:
        """Mark the engine core gone and close the sockets (idempotent)."""
        self._closed = True
        self._input_socket.close(linger=0)
        self._output_socket.close(linger=0)


class MPClient(SocketClient):
    """Owns the EngineCore process. Use from one event loop; `shutdown()` is idempotent.
    `stall_timeout_s`: the engine's own watchdog (--engine-stall-timeout; 0: none)."""

    def __init__(
        self, config: EngineConfig, stall_timeout_s: float = 0.0, process: ChildProcess | None = None
    ) -> None:
        self.stall_timeout_s = stall_timeout_s
        # NOTE: abstract Unix sockets ("@", Linux): no file to leave behind, even when SIGKILLed.
        name = f"ipc://@pagedserve-{os.getpid()}-{uuid.uuid4().hex}"
        input_address, output_address = f"{name}-input", f"{name}-output"
        self._context = zmq.asyncio.Context()
        input_socket = self._context.socket(zmq.PUSH)
        input_socket.bind(input_address)
        output_socket = self._context.socket(zmq.PULL)
        output_socket.bind(output_address)
        super().__init__(input_socket, output_socket)
        # NOTE: a fresh interpreter, not multiprocessing: the user's __main__ is never re-imported there;
        # or `process`, the one that resolved `config` (config/frontend_config.py). shutdown() (also run at
        # exit) ends it.
        args = (config, input_address, output_address, stall_timeout_s)
        if process is None:
            process = ChildProcess(run_engine_core, args, "EngineCore")
        else:
            process.run(run_engine_core, args)
        self.process = process
        atexit.register(self.shutdown)
        logger.info("Started the engine core process (pid %d).", self.process.pid)

    def is_alive(self) -> bool:
        return not self._closed and self.process.is_alive()

    def dead_error(self) -> EngineDeadError:
        if self.process.exitcode == STALL_EXIT_CODE:
            return EngineDeadError(stall_message(self.stall_timeout_s))
        return EngineDeadError(
            f"The engine core process (pid {self.process.pid}) died with exit code "
            f"{self.process.exitcode}; see the server log. The server must be restarted."
        )

    def kill(self) -> None:
        """End an unresponsive engine process at once (it may be stopped or stuck)."""
        if self.process.is_alive():
            self.process.kill()
            self.process.join(_SHUTDOWN_TIMEOUT_S)

    def shutdown(self) -> None:
        """Ask the process to stop, then terminate it if it does not within a few seconds."""
        if self._closed:
            return
        atexit.unregister(self.shutdown)
        if self.process.is_alive():
            self.request_shutdown()
            self.process.join(_SHUTDOWN_TIMEOUT_S)
            if self.process.is_alive():
                logger.warning(
                    "The engine core did not stop within %.0f s: terminating it.", _SHUTDOWN_TIMEOUT_S
                )
                self.process.terminate()
                self.process.join(_SHUTDOWN_TIMEOUT_S)
                if self.process.is_alive():
                    self.process.kill()
                    self.process.join()
        self.close()
        self._context.destroy(linger=0)
