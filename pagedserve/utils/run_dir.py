"""Private temporary folders named after their process (`pagedserve-KIND-PID-XXXX`), so that one left by a
SIGKILLed process is recognisably stale: the next start removes those whose process is gone. No torch."""

import os
import shutil
import tempfile


def make_run_dir(kind: str) -> str:
    """A new folder for this process; first removes this user's `kind` folders of dead processes."""
    _reclaim_stale(kind)
    return tempfile.mkdtemp(prefix=f"pagedserve-{kind}-{os.getpid()}-")


def _reclaim_stale(kind: str) -> None:
    prefix = f"pagedserve-{kind}-"
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        pid = name[len(prefix) :].split("-", 1)[0] if name.startswith(prefix) else ""
        path = os.path.join(root, name)
        # NOTE: only our own folders, and only when their process is gone (a reused pid keeps it: safe).
        if pid.isdigit() and os.stat(path).st_uid == os.getuid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
