"""The worker side of the multiprocess executor: one process per rank, serving calls from a pipe.

Protocol (one pickle per call, the same bytes written to every rank's pipe):
engine -> worker: (method, args, unique_reply_rank); worker -> engine: (True, result) or (False, failure).
Calls run one at a time, in the order they arrive; with pipeline stages the engine sends a step while the
ranks still run earlier ones, and a thread takes each call off the pipe as it arrives (`_receiver`).
"""

import pickle
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from pagedserve.config import EngineConfig
from pagedserve.distributed import DistributedInit, init_distributed_environment
from pagedserve.errors import ConfigError
from pagedserve.executor.failure import summarize
from pagedserve.logger import init_logger
from pagedserve.utils.process import die_with_parent
from pagedserve.worker.worker import Worker

logger = init_logger(__name__)

SHUTDOWN = "__shutdown__"  # a method name that ends the serving loop


@dataclass(frozen=True)
class WorkerProcessSpec:
    """Everything a worker process needs; pickled into it when it starts."""

    config: EngineConfig
    rank: int
    init: DistributedInit


@dataclass(frozen=True)
class WorkerFailure:
    """Why a rank stopped: a summary for the engine's error; a ConfigError travels as itself."""

    summary: str  # summarize(exc)
    config_error: ConfigError | None


def dumps(message: object) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def run_worker(conn: Connection, spec: WorkerProcessSpec) -> None:
    """Entry point of a worker process: join the group, build the Worker, answer calls until SHUTDOWN or
    until the engine's end of the pipe closes. A failing call is reported, then the process exits: its
    peers are out of lockstep, and the engine stops every rank."""
    die_with_parent(signal.SIGKILL)  # the parent: the process of the executor
    # NOTE: Ctrl-C reaches the whole process group; the engine decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        init_distributed_environment(spec.init, spec.rank)
        worker = Worker(spec.config, spec.rank)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the engine
        _report_failure(conn, spec.rank, "startup", exc)
        return
    conn.send_bytes(dumps((True, None)))
    _serve(worker, spec.rank, conn, _receiver(conn, spec.config.parallel.pipeline_parallel_size > 1))


def _receiver(conn: Connection, pipelined: bool) -> Callable[[], bytes]:
    """How the serving loop takes the next call (raises EOFError once the engine is gone). Pipelined: a
    thread reads every call as soon as it arrives, so that the engine's write of a step never waits for
    this rank to finish an earlier one (a large step and a large answer would otherwise each wait for
    the other side to read)."""
    if not pipelined:
        return conn.recv_bytes
    inbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def read_calls() -> None:
        try:
            while True:
                inbox.put(conn.recv_bytes())
        except (EOFError, OSError):
            inbox.put(None)

    threading.Thread(target=read_calls, name="pagedserve-calls", daemon=True).start()

    def receive() -> bytes:
        data = inbox.get()
        if data is None:
            raise EOFError("the engine closed the pipe")
        return data

    return receive


@torch.inference_mode()  # NOTE: once for every call: the model runner enters it at each step otherwise
def _serve(worker: Worker, rank: int, conn: Connection, receive: Callable[[], bytes]) -> None:
    import torch.distributed as dist

    while True:
        try:
            method, args, unique_reply_rank = pickle.loads(receive())
        except (EOFError, OSError):
            return  # the engine is gone
        if method == SHUTDOWN:
            dist.destroy_process_group()
            return
        try:
            result = getattr(worker, method)(*args)
        except BaseException as exc:  # noqa: BLE001
            _report_failure(conn, rank, method, exc)
            return
        conn.send_bytes(dumps((True, result if unique_reply_rank in (None, rank) else None)))


def _report_failure(conn: Connection, rank: int, call: str, exc: BaseException) -> None:
    logger.exception("Rank %d failed during %s.", rank, call)
    failure = WorkerFailure(summarize(exc), exc if isinstance(exc, ConfigError) else None)
    try:
        conn.send_bytes(dumps((False, failure)))
    except OSError:
        pass  # the engine is gone too
