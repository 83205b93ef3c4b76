"""The tensor-parallel rendezvous folders (/tmp/pagedserve-tp-PID-*) that a SIGKILLed engine leaves are
removed at the next start, and only those: a live process's folder stays."""

import os
import subprocess
import sys
import tempfile

from pagedserve.utils.run_dir import make_run_dir


def test_folders_of_dead_processes_are_reclaimed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a private temp root for this test
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is now free
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f"pagedserve-tp-{dead.pid}-abc"
        kept = tmp_path / f"pagedserve-tp-{live.pid}-def"
        other_kind = tmp_path / f"pagedserve-x-{dead.pid}-ghi"
        for folder in (stale, kept, other_kind):
            folder.mkdir()
            (folder / "store").write_text("rendezvous")
        new = make_run_dir("tp")
        assert os.path.basename(new).startswith(f"pagedserve-tp-{os.getpid()}-")
        assert not stale.exists() and kept.exists() and other_kind.exists() and os.path.isdir(new)
    finally:
        live.kill()
        live.wait()
