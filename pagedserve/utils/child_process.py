"""Child processes as fresh interpreters (`python -m pagedserve.utils.child_main`), never multiprocessing's
spawn or forkserver: those re-import the parent's `__main__` in the child, so a user's script without an
`if __name__ == "__main__":` guard (or a notebook) would run again there and die in multiprocessing's
bootstrapping check. Here the child imports only pagedserve: it receives `(target, args)` pickled over a
socket pair and calls `target(conn, *args)`, `conn` being its end of that socket (a multiprocessing
Connection, for the caller's own protocol). No torch at import."""

import os
import pickle
import socket
import subprocess
import sys
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection


class ChildProcess:
    """A started child; the subset of multiprocessing.Process the executors use (`pid`, `sentinel`,
    `exitcode`, `is_alive`, `join`, `terminate`, `kill`). `conn`: the parent's end of the socket."""

    def __init__(self, target: Callable[..., None], args: tuple[object, ...], name: str) -> None:
        ours, theirs = socket.socketpair()
        # NOTE: the name is in the command line only so that `ps` (and tests) can tell children apart.
        self._popen = subprocess.Popen(
            [sys.executable, "-m", "pagedserve.utils.child_main", str(theirs.fileno()), name],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self.name = name
        self.pid = self._popen.pid
        # NOTE: a pidfd (Linux >= 5.3) becomes readable when the process exits: waitable with the pipes.
        self.sentinel = os.pidfd_open(self.pid)
        weakref.finalize(self, os.close, self.sentinel)
        self.conn = Connection(ours.detach())
        self.run(target, args)

    def run(self, target: Callable[..., None], args: tuple[object, ...]) -> None:
        """Send the child `target(conn, *args)` to run: its first, or the next one where its current target
        ends in `child_main.run_next_target`."""
        self.conn.send_bytes(pickle.dumps((target, args), protocol=pickle.HIGHEST_PROTOCOL))

    @property
    def exitcode(self) -> int | None:
        """None while running; the exit status, or -N when killed by signal N (as multiprocessing)."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()
