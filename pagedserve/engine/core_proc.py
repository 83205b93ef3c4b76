"""The EngineCore in its own process (started by mp_client.MPClient as a ChildProcess), so HTTP handling and Python
tokenization never steal the model's time.

Wire protocol over two ZMQ PUSH/PULL sockets, both bound by the client:
- input (client -> core): multipart [EngineCoreRequestType, msgpack payload];
- output (core -> client): first one EngineCoreHandshake, then one msgpack EngineCoreOutputs per message.
"""

import re
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from types import FrameType
from typing import TypeVar

import msgspec
import zmq

from pagedserve.config import EngineConfig
from pagedserve.engine.core import EngineCore
from pagedserve.engine.dp_auth import CurveKeys, exit_when_disconnected, secure_client
from pagedserve.engine.watchdog import StallWatchdog
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreRequestType,
    FinishReason,
)
from pagedserve.utils.process import die_with_parent

logger = init_logger(__name__)

T = TypeVar("T")

# How long the loop waits for input when idle.
IDLE_POLL_S = 1.0
_MAX_LOGGED_REQUESTS = 20  # running requests listed by name when a step stalls


class EngineCoreHandshake(msgspec.Struct, omit_defaults=True):
    """The first output message: the engine is ready (KV cache sized), or why it failed to start."""

    num_blocks: int = 0
    block_size: int = 0
    num_host_blocks: int = 0  # swap space, per worker
    model_weight_bytes: int = 0  # the weights resident on every rank together
    error: str | None = None
    config_error: bool = False  # the error is the user's settings (ConfigError), not a crash


class _RequestId(msgspec.Struct, array_like=True):
    """An EngineCoreRequest's first field alone: who to fail when the rest of it does not decode."""

    request_id: str


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
        # NOTE: a batch is decoded request by request: a bad one fails alone, never the batch or the loop.
        self.batch_decoder = msgspec.msgpack.Decoder(list[msgspec.Raw])
        self.request_decoder = msgspec.msgpack.Decoder(EngineCoreRequest)
        self.request_id_decoder = msgspec.msgpack.Decoder(_RequestId)
        self.abort_decoder = msgspec.msgpack.Decoder(list[str])
        self.level_decoder = msgspec.msgpack.Decoder(int)
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
            try:
                kind, payload = EngineCoreRequestType(frames[0]), frames[1]
            except (ValueError, IndexError):  # not from our client: drop it, keep serving
                logger.error(
                    "Dropped an input message of unknown type or shape (%d frames, %d bytes).",
                    len(frames),
                    sum(len(frame) for frame in frames),
                )
                continue
            self._handle_input(kind, payload)
            if self.shutdown_requested:
                return True

    def _handle_input(self, kind: EngineCoreRequestType, payload: bytes) -> None:
        if kind is EngineCoreRequestType.ADD:
            failed = self._add_requests(payload)
            if failed:  # their callers learn it now, not at the next step
                self._send(EngineCoreOutputs(failed, self.engine_core.get_stats(), time.time()))
        elif kind is EngineCoreRequestType.ABORT:
            request_ids = self._decode_or_drop(self.abort_decoder, kind, payload)
            self.engine_core.abort_requests(request_ids or [])
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
        elif kind is EngineCoreRequestType.SLEEP:
            level = self._decode_or_drop(self.level_decoder, kind, payload)
            if level is not None:
                self.engine_core.sleep(level)
            self._send(EngineCoreOutputs(timestamp=time.time(), sleep_level=self.engine_core.sleep_level))
        elif kind is EngineCoreRequestType.WAKE_UP:
            self.engine_core.wake_up()
            self._send(EngineCoreOutputs(timestamp=time.time(), sleep_level=self.engine_core.sleep_level))
        elif kind is EngineCoreRequestType.SHUTDOWN:
            self.shutdown_requested = True

    @staticmethod
    def _decode_or_drop(
        decoder: msgspec.msgpack.Decoder[T], kind: EngineCoreRequestType, payload: bytes
    ) -> T | None:
        """The decoded payload; None (logged with its size) when it does not decode at all."""
        try:
            return decoder.decode(payload)
        except msgspec.DecodeError as exc:
            logger.error(
                "Dropped a %s message of %d bytes that does not decode: %s", kind.name, len(payload), exc
            )
            return None

    def _add_requests(self, payload: bytes) -> list[EngineCoreOutput]:
        """Queue each request of an ADD batch on its own. One that does not decode, or that the engine
        cannot take, ends at once: returns an ERROR output for each (the others are queued)."""
        failed: list[EngineCoreOutput] = []
        for raw in self._decode_or_drop(self.batch_decoder, EngineCoreRequestType.ADD, payload) or []:
            try:
                request = self.request_decoder.decode(raw)
            except Exception as exc:  # a field of a wrong type (ValidationError), or a check that raised
                failed += self._failed_output(raw, f"its input could not be decoded: {_name_field(exc)}")
                continue
            try:
                self.engine_core.add_request(request)
            except Exception as exc:
                logger.exception("The engine could not take request %s.", request.request_id)
                failed.append(_error_output(request.request_id, f"the engine could not take it: {exc!r}"))
        return failed

    def _failed_output(self, raw: msgspec.Raw, error: str) -> list[EngineCoreOutput]:
        """The ERROR output of a request that did not decode; none when not even its id does (logged)."""
        try:
            request_id = self.request_id_decoder.decode(raw).request_id
        except msgspec.DecodeError:
            logger.error("Dropped a request of %d bytes without a readable id: %s", len(raw), error)
            return []
        logger.error("Request %s failed: %s", request_id, error)
        return [_error_output(request_id, error)]

    def _send(self, outputs: EngineCoreOutputs) -> None:
        self.output_socket.send(self.encoder.encode(outputs), copy=False)


def _name_field(error: Exception) -> str:
    """msgspec's message with its path into the array-like EngineCoreRequest (`$[5]`) by field name
    (`cache_salt`), so the caller's error says which field was wrong."""
    fields = EngineCoreRequest.__struct_fields__
    return re.sub(
        r"`\$\[(\d+)\]",
        lambda match: f"`{fields[int(match[1])]}" if int(match[1]) < len(fields) else match[0],
        str(error),
    )


def _error_output(request_id: str, error: str) -> EngineCoreOutput:
    return EngineCoreOutput(request_id, [], finish_reason=FinishReason.ERROR, error=error)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"signal {signum}")  # unwinds through run_engine_core's cleanup (the workers)


def run_engine_core(
    launcher: Connection,
    config: EngineConfig,
    input_address: str,
    output_address: str,
    stall_timeout_s: float = 0.0,
    keys: CurveKeys | None = None,
) -> None:
    """Process entry point: serve_engine_core() in a child of the API server (or of a --headless
    launcher). Dies with its parent, whatever kills it: SIGTERM then (a clean stop of the workers),
    SIGKILL if that does not end it."""
    # NOTE: Ctrl-C reaches the whole process group; the API server then shuts this process down cleanly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    die_with_parent(signal.SIGTERM)
    launcher.close()  # the socket that brought the arguments (ChildProcess): the rest goes over ZMQ
    serve_engine_core(config, input_address, output_address, stall_timeout_s, keys)


def serve_engine_core(
    config: EngineConfig,
    input_address: str,
    output_address: str,
    stall_timeout_s: float = 0.0,
    keys: CurveKeys | None = None,
) -> None:
    """Connect to the client's sockets, build the EngineCore, report readiness, run the busy loop.
    Returns after a SHUTDOWN; exits 1 when the engine fails to start or crashes (the traceback goes to
    the log), STALL_EXIT_CODE when a step runs past `stall_timeout_s` (0: no watchdog). `keys`: the
    client is the data-parallel head over TCP (CURVE); losing it ends this process."""
    context = zmq.Context()
    input_socket = context.socket(zmq.PULL)
    output_socket = context.socket(zmq.PUSH)
    stopping = threading.Event()
    if keys is not None:
        for socket in (input_socket, output_socket):
            secure_client(socket, keys)
        stopping = exit_when_disconnected(output_socket, f"the data-parallel head at {output_address}")
    input_socket.connect(input_address)
    output_socket.connect(output_address)
    encoder = msgspec.msgpack.Encoder()
    engine_core = None
    try:
        engine_core = EngineCore(config)
        kv = engine_core.kv_cache_config
        output_socket.send(
            encoder.encode(
                EngineCoreHandshake(
                    kv.num_blocks, kv.block_size, kv.num_host_blocks, engine_core.model_weight_bytes
                )
            )
        )
        # NOTE: the model runner enters inference mode at each step unless its thread is in it already: this
        # process's steps all run here. torch is imported here: the API server imports this module.
        import torch

        with torch.inference_mode():
            EngineCoreProc(engine_core, input_socket, output_socket, stall_timeout_s).run_busy_loop()
        stopping.set()
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
