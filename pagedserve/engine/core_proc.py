"""The EngineCore in its own process (started by mp_client.MPClient as a ChildProcess), so HTTP handling and Python
tokenization never steal the model's time.

Wire protocol over two ZMQ PUSH/PULL sockets, both bound by the client:
- input (client -> core): multipart [EngineCoreRequestType, msgpack payload];
- output (core -> client): first one EngineCoreHandshake, then one msgpack EngineCoreOutputs per message.
"""

import signal
import sys
import time
from multiprocessing.connection import Connection
from types import FrameType

import msgspec
import zmq

from pagedserve.config import EngineConfig
from pagedserve.engine.core import EngineCore
from pagedserve.engine.watchdog import StallWatchdog
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.protocol import EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType
from pagedserve.utils.process import die_with_parent

logger = init_logger(__name__)

# How long the loop waits for input when idle.
IDLE_POLL_S = 1.0
_MAX_LOGGED_REQUESTS = 20  # running requests listed by name when a step stalls


class EngineCoreHandshake(msgspec.Struct, omit_defaults=True):
    """The first output message: the engine is ready (KV cache sized), or why it failed to start."""

    num_blocks: int = 0
    block_size: int = 0
    num_host_blocks: int = 0  # swap space, per worker
    error: str | None = None
    config_error: bool = False  # the error is the user's settings (ConfigError), not a crash


class EngineCoreProc:
    """The busy loop: take every pending input, step while there is work, push the outputs."""

    def __init__(
        self,
        engine_core: EngineCore,
        input_socket: zmq.Socket[bytes],
        output_socket: zmq.Socket[bytes],
        stall_timeout_s: float = 0.0,
    ) -> None:
        self.engine_core = engine_core
        self.input_socket = input_socket
        self.output_socket = output_socket
        self.encoder = msgspec.msgpack.Encoder()
        self.add_decoder = msgspec.msgpack.Decoder(list[EngineCoreRequest])
        self.abort_decoder = msgspec.msgpack.Decoder(list[str])
        self.shutdown_requested = False
        self.watchdog = StallWatchdog(stall_timeout_s, self._describe_state) if stall_timeout_s > 0 else None

    def run_busy_loop(self) -> None:
        """Returns on a SHUTDOWN message. (When the API server dies, this process gets SIGTERM.)"""
        while not self.shutdown_requested:
            busy = self.engine_core.has_unfinished_requests()
            got_input = self._process_input(0 if busy else int(IDLE_POLL_S * 1000))
            if self.shutdown_requested:
                return
            if self.engine_core.has_unfinished_requests():
                self._send(self._step())
            elif got_input:
                # NOTE: e.g. an abort emptied the engine: report the freed blocks now, not at the next step.
                self._send(
                    EngineCoreOutputs(scheduler_stats=self.engine_core.get_stats(), timestamp=time.time())
                )

    def _step(self) -> EngineCoreOutputs:
        if self.watchdog is None:
            return self.engine_core.step()
        self.watchdog.step_started()
        try:
            return self.engine_core.step()
        finally:
            self.watchdog.step_finished()

    def _describe_state(self) -> str:
        return self.engine_core.describe(_MAX_LOGGED_REQUESTS)

    def _process_input(self, timeout_ms: int) -> bool:
        """Wait up to `timeout_ms` for input, then handle all of it. True if there was any."""
        if not self.input_socket.poll(timeout_ms):
            return False
        while True:
            try:
                frames = self.input_socket.recv_multipart(flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return True
            kind = EngineCoreRequestType(frames[0])
            if kind is EngineCoreRequestType.ADD:
                for request in self.add_decoder.decode(frames[1]):
                    self.engine_core.add_request(request)
            elif kind is EngineCoreRequestType.ABORT:
                self.engine_core.abort_requests(self.abort_decoder.decode(frames[1]))
            elif kind is EngineCoreRequestType.RESET_PREFIX_CACHE:
                self.engine_core.reset_prefix_cache()
            elif kind is EngineCoreRequestType.BLOCK_SNAPSHOT:
                self._send(
                    EngineCoreOutputs(
                        scheduler_stats=self.engine_core.get_stats(),
                        timestamp=time.time(),
                        block_snapshot=self.engine_core.block_snapshot(),
                    )
                )
            elif kind is EngineCoreRequestType.SHUTDOWN:
                self.shutdown_requested = True
                return True
            else:
                logger.error("Ignored an input of unknown type %r.", kind)

    def _send(self, outputs: EngineCoreOutputs) -> None:
        self.output_socket.send(self.encoder.encode(outputs), copy=False)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"signal {signum}")  # unwinds through run_engine_core's cleanup (the workers)


def run_engine_core(
    launcher: Connection,
    config: EngineConfig,
    input_address: str,
    output_address: str,
    stall_timeout_s: float = 0.0,
) -> None:
    """Process entry point: build the EngineCore, report readiness, run the busy loop. Exits 0 after a
    SHUTDOWN, 1 when the engine fails to start or crashes (the traceback goes to the log), STALL_EXIT_CODE
    when a step runs past `stall_timeout_s` (0: no watchdog). Dies with the API server, whatever kills
    it: SIGTERM then (a clean stop of the workers), SIGKILL if that does not end it."""
    # NOTE: Ctrl-C reaches the whole process group; the API server then shuts this process down cleanly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    die_with_parent(signal.SIGTERM)
    launcher.close()  # the socket that brought the arguments (ChildProcess): the rest goes over ZMQ
    context = zmq.Context()
    input_socket = context.socket(zmq.PULL)
    input_socket.connect(input_address)
    output_socket = context.socket(zmq.PUSH)
    output_socket.connect(output_address)
    encoder = msgspec.msgpack.Encoder()
    engine_core = None
    try:
        engine_core = EngineCore(config)
        kv = engine_core.kv_cache_config
        output_socket.send(
            encoder.encode(EngineCoreHandshake(kv.num_blocks, kv.block_size, kv.num_host_blocks))
        )
        EngineCoreProc(engine_core, input_socket, output_socket, stall_timeout_s).run_busy_loop()
    except Exception as exc:
        if engine_core is None:  # failed to start: tell the client why
            if not isinstance(exc, ConfigError):
                logger.exception("The engine core failed to start.")
            output_socket.send(
                encoder.encode(EngineCoreHandshake(error=str(exc), config_error=isinstance(exc, ConfigError)))
            )
        else:
            logger.exception("The engine core crashed.")
        output_socket.close(linger=2000)
        sys.exit(1)
    finally:
        if engine_core is not None:
            engine_core.shutdown()
    context.destroy(linger=0)
