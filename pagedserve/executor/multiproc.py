"""Multiprocess executor: one worker process per rank on this machine, joined by torch.distributed
(gloo on CPU, NCCL on CUDA) with every socket on 127.0.0.1. The engine keeps no model: it pickles each
call once, writes the bytes to every rank's pipe, and waits on the pipes and the processes' sentinels
together, so a dead or hung rank becomes an EngineDeadError instead of a silent hang. With pipeline stages
a step may be sent before the earlier ones are answered (`execute_model(..., non_block=True)`): the ranks
answer in order, and the answers are read when a step's future or any other call needs them."""

import os
import pickle
import shutil
import time
import weakref
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import cast

from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.distributed import DistributedInit
from pagedserve.errors import EngineDeadError
from pagedserve.executor.base import Executor, StepFuture
from pagedserve.executor.failure import GRACE_S, RankFailures, describe_exit
from pagedserve.executor.mp_worker import SHUTDOWN, WorkerFailure, WorkerProcessSpec, dumps, run_worker
from pagedserve.logger import init_logger
from pagedserve.platforms import get_platform
from pagedserve.utils.child_process import ChildProcess
from pagedserve.utils.run_dir import make_run_dir

logger = init_logger(__name__)

_SHUTDOWN_JOIN_S = 5.0
_STARTUP_TIMEOUT_S = 600.0  # the least time a rank gets to start (--distributed-timeout when longer)


@dataclass
class _WorkerHandle:
    rank: int
    process: ChildProcess
    conn: Connection  # duplex pipe to the worker


@dataclass
class _PendingStep:
    """A step sent to every rank, its answers not read yet. `collect_oldest` reads the answers of the
    oldest pending step (they come in the order the steps went out) until this one's are in."""

    collect_oldest: Callable[[], None]
    output: ModelRunnerOutput | None = None

    def result(self) -> ModelRunnerOutput:
        while self.output is None:
            self.collect_oldest()
        return self.output


class MultiprocExecutor(Executor):
    """All ranks as child processes (vLLM v1's layout): the engine loop only sends and receives."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        parallel = config.parallel
        self.timeout_s = parallel.distributed_timeout_s
        self._failure: EngineDeadError | None = None
        self._rendezvous = make_run_dir("tp")
        # NOTE: a file rendezvous opens no port; tcp:// would listen on every interface.
        store = os.path.join(self._rendezvous, "store")
        init = DistributedInit(
            f"file://{store}",
            parallel.world_size,
            get_platform(config.device).dist_backend,
            self.timeout_s,
            loopback_only=True,
        )
        self.workers: list[_WorkerHandle] = []
        self._pending: deque[_PendingStep] = deque()  # steps sent whose answers are not read, oldest first
        for rank in range(parallel.world_size):
            # NOTE: fresh interpreters, not multiprocessing: the user's __main__ is never re-imported.
            process = ChildProcess(
                run_worker, (WorkerProcessSpec(config, rank, init),), f"pagedserve-tp{rank}"
            )
            self.workers.append(_WorkerHandle(rank, process, process.conn))
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers, self._rendezvous, True)
        # NOTE: each rank answers once its Worker is built: a fresh interpreter imports torch and loads the
        # weights first, which may take longer than a step may (a death is still seen at once).
        self._gather("startup", max(self.timeout_s, _STARTUP_TIMEOUT_S))
        logger.info(
            "Started %d worker processes (tp=%d x pp=%d; pids %s).",
            len(self.workers),
            parallel.tensor_parallel_size,
            parallel.pipeline_parallel_size,
            ", ".join(str(w.process.pid) for w in self.workers),
        )

    def collective_rpc(
        self, method: str, args: tuple[object, ...] = (), unique_reply_rank: int | None = None
    ) -> list[object]:
        while self._pending:  # NOTE: every rank answers in order: the next answers are those steps'
            self._collect_oldest_step()
        self._send(method, args, unique_reply_rank)
        results = self._gather(method)
        return results if unique_reply_rank is None else [results[unique_reply_rank]]

    def _start_step(self, scheduler_output: SchedulerOutput) -> StepFuture:
        self._send("execute_model", (scheduler_output,), self.sampler_rank)
        step = _PendingStep(self._collect_oldest_step)
        self._pending.append(step)
        return step

    def _collect_oldest_step(self) -> None:
        if self._failure is not None:
            raise self._failure
        step = self._pending.popleft()
        step.output = cast(ModelRunnerOutput, self._gather("execute_model")[self.sampler_rank])

    def _send(self, method: str, args: tuple[object, ...], unique_reply_rank: int | None) -> None:
        """Write one call to every rank (in one pickle)."""
        if self._failure is not None:
            raise self._failure
        data = dumps((method, args, unique_reply_rank))
        for worker in self.workers:
            try:
                worker.conn.send_bytes(data)
            except OSError:
                break  # its process is gone: _gather names it

    def worker_pids(self) -> list[int | None]:
        """The process id of each rank, in rank order."""
        return [w.process.pid for w in self.workers]

    def shutdown(self) -> None:
        self._finalizer()

    def _gather(self, call: str, timeout_s: float | None = None) -> list[object]:
        """Every rank's answer, in rank order. On the first death, failure or silence past the timeout
        (default --distributed-timeout), stops every worker and raises (EngineDeadError, or a worker's
        ConfigError)."""
        timeout_s = timeout_s or self.timeout_s
        results: dict[int, object] = {}
        failures = RankFailures(call, timeout_s)
        deadline = time.monotonic() + timeout_s
        while len(results) < len(self.workers) and not failures:
            waiting = [w for w in self.workers if w.rank not in results]
            ready = wait(
                [w.conn for w in waiting] + [w.process.sentinel for w in waiting],
                timeout=max(0.0, deadline - time.monotonic()),
            )
            failures.timed_out = not ready
            for worker in waiting:
                self._read(worker, ready, results, failures)
        if failures:
            self._fail(failures, results)
        return [results[w.rank] for w in self.workers]

    def _read(
        self,
        worker: _WorkerHandle,
        ready: Collection[object],
        results: dict[int, object],
        failures: RankFailures,
    ) -> None:
        """Take one rank's answer, failure report or death from the `ready` objects of wait()."""
        if worker.conn in ready or (worker.process.sentinel in ready and worker.conn.poll()):
            try:
                ok, payload = pickle.loads(worker.conn.recv_bytes())
            except (EOFError, OSError):  # the process is exiting: its sentinel follows at once
                worker.process.join(1.0)
                failures.died[worker.rank] = describe_exit(worker.process.pid, worker.process.exitcode)
                return
            if ok:
                results[worker.rank] = payload
            else:
                assert isinstance(payload, WorkerFailure)
                failures.raised[worker.rank] = payload.summary
                failures.config_error = failures.config_error or payload.config_error
        elif worker.process.sentinel in ready:
            worker.process.join(1.0)
            failures.died[worker.rank] = describe_exit(worker.process.pid, worker.process.exitcode)

    def _fail(self, failures: RankFailures, results: dict[int, object]) -> None:
        """Give the other ranks a moment to report (a peer's error is often the consequence of a death
        the sentinel shows a little later), stop every worker, and raise."""
        grace_end = time.monotonic() + (0.0 if failures.timed_out else GRACE_S)
        pending = [w for w in self.workers if w.rank not in results and not failures.resolved(w.rank)]
        while pending and time.monotonic() < grace_end:
            ready = wait(
                [w.conn for w in pending] + [w.process.sentinel for w in pending],
                timeout=max(0.0, grace_end - time.monotonic()),
            )
            for worker in pending:
                self._read(worker, ready, results, failures)
            pending = [w for w in pending if w.rank not in results and not failures.resolved(w.rank)]
        failures.silent = [w.rank for w in pending]
        self._finalizer.detach()
        _stop_workers(self.workers, self._rendezvous, graceful=False)
        error = failures.error()
        self._failure = error if isinstance(error, EngineDeadError) else EngineDeadError(str(error))
        logger.error("%s", error)
        raise error


def _stop_workers(workers: list[_WorkerHandle], rendezvous: str, graceful: bool) -> None:
    """Ask each worker to leave (graceful), then kill whatever is still running. Idempotent."""
    if graceful:
        for worker in workers:
            try:
                worker.conn.send_bytes(dumps((SHUTDOWN, (), None)))
            except OSError:
                pass
        deadline = time.monotonic() + _SHUTDOWN_JOIN_S
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(1.0)
        worker.conn.close()
    shutil.rmtree(rendezvous, ignore_errors=True)
