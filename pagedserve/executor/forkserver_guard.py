"""Imported by the multiprocess executor's forkserver only (multiproc._worker_context preloads it): the
forkserver then dies with the engine process that started it, and its workers with it (PDEATHSIG).

NOTE: without this the forkserver outlives a dead engine for as long as any worker lives, because every
forked worker holds the forkserver's "alive" pipe; a worker that is hung or stopped never exits by
itself, so the two would keep each other (and the accelerator memory) forever.
"""
import signal

from pagedserve.utils.process import die_with_parent

die_with_parent(signal.SIGKILL, watch=False)  # no thread: the forkserver forks
