"""The stall watchdog (--engine-stall-timeout): an engine that stops making progress while it has work
fails like a dead one (errors to the clients, /health 503, the server exits 1) instead of hanging.

Two layers, so that whatever hangs is caught:
- in the engine core process, `StallWatchdog`, a thread, sees a step that runs too long (a hung kernel,
  collective or worker), logs the state and the step in progress, and exits with STALL_EXIT_CODE;
- in the API server, `stall_error()` covers an engine process that cannot even run that thread (frozen,
  stopped): no output for the timeout plus FRONTEND_GRACE_S while requests are in flight.
"""

import os
import threading
import time
from collections.abc import Callable

from pagedserve.logger import init_logger

logger = init_logger(__name__)

STALL_EXIT_CODE = 86  # the engine core's exit status after a stall (MPClient names it)
# The API server waits this much longer than the engine's own watchdog, which says more (the step).
FRONTEND_GRACE_S = 5.0


def poll_interval_s(timeout_s: float) -> float:
    """How often a watchdog looks: often enough to fire within a quarter of the timeout, 1 s at most."""
    return min(1.0, timeout_s / 4)


class StallWatchdog:
    """Watches the engine core's steps from a daemon thread. The busy loop calls `step_started()` and
    `step_finished()` around each step; when one step has run for `timeout_s`, the thread logs
    `describe()` (the state, read without locks: the stuck main thread is not changing it) and calls
    `on_stall` (default: exit the process at once with STALL_EXIT_CODE, as the main thread is stuck)."""

    def __init__(
        self, timeout_s: float, describe: Callable[[], str], on_stall: Callable[[], None] | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.describe = describe
        self.on_stall = on_stall or _exit_stalled
        self.num_steps = 0
        self._step_started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)
        self._thread.start()

    def step_started(self) -> None:
        self.num_steps += 1
        self._step_started = time.monotonic()

    def step_finished(self) -> None:
        self._step_started = None

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(poll_interval_s(self.timeout_s)):
            started = self._step_started
            if started is None or time.monotonic() - started < self.timeout_s:
                continue
            try:
                state = self.describe()
            except Exception as exc:  # noqa: BLE001  # the state is a courtesy: the exit must happen
                state = f"(the state could not be read: {exc!r})"
            logger.error(
                "The engine made no progress for %.0f s (--engine-stall-timeout): step %d started "
                "%.1f s ago and has not finished. %s The engine core exits (status %d); the server "
                "fails its requests and exits.",
                self.timeout_s,
                self.num_steps,
                time.monotonic() - started,
                state,
                STALL_EXIT_CODE,
            )
            self.on_stall()
            return


def _exit_stalled() -> None:
    # NOTE: os._exit, not sys.exit: the main thread is stuck and would never unwind. Worker processes
    # follow (they die with their parent, see executor/mp_worker.py).
    os._exit(STALL_EXIT_CODE)


def stall_message(timeout_s: float) -> str:
    """What the clients are told when the engine stalled."""
    return (
        f"The engine made no progress for {timeout_s:.0f} s while it had work (--engine-stall-timeout) "
        "and was stopped; see the server log for the state it was in. The server must be restarted."
    )
