"""Process helpers with no torch dependency: child processes that never outlive their parent."""

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
_PARENT_POLL_S = 1.0
_KILL_AFTER_S = 5.0  # after `signum`, if the process is still there


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Make this process receive `signum` when its parent dies, whatever killed the parent (SIGKILL
    included). On Linux the kernel sends it (PR_SET_PDEATHSIG); a thread also polls the parent, which
    covers other systems and a parent that died before prctl ran. A `signum` other than SIGKILL (for a
    clean exit) is followed by SIGKILL if the process is still alive a few seconds later.
    NOTE: PDEATHSIG follows the parent *thread* that started us: call this only in children started
    from a thread that lives as long as their parent (the main thread)."""
    parent_pid = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
    threading.Thread(
        target=_watch_parent, args=(parent_pid, signum), name="parent-watch", daemon=True
    ).start()


def _watch_parent(parent_pid: int, signum: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_S)
    # NOTE: a signal, not sys.exit: the main thread may sit in a collective or a long step.
    os.kill(os.getpid(), signum)
    if signum != signal.SIGKILL:
        time.sleep(_KILL_AFTER_S)
        os.kill(os.getpid(), signal.SIGKILL)
