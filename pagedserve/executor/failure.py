"""What went wrong on which rank during one call to the workers, turned into one error."""

import signal
from dataclasses import dataclass, field

from pagedserve.errors import EngineDeadError

GRACE_S = 2.0  # after a first failure: how long the other ranks get to report theirs (the root cause)
_MAX_SUMMARY_CHARS = 200


def summarize(exc: BaseException) -> str:
    """'RuntimeError: <first line, at most 200 characters>' (the full traceback goes to the log)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) > _MAX_SUMMARY_CHARS:
        text = text[:_MAX_SUMMARY_CHARS] + "..."
    return f"{type(exc).__name__}: {text}"


def describe_exit(pid: int | None, exitcode: int | None) -> str:
    """'pid 123, killed by SIGKILL' / 'pid 123, exit code 1'."""
    if exitcode is not None and exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
    else:
        how = f"exit code {exitcode}"
    return f"pid {pid}, {how}"


@dataclass
class RankFailures:
    """Collected while the engine waits on a call. `error()` lists the likely causes first: ranks that
    died, then ranks that raised, then ranks still silent (hung, or blocked in a collective on a peer)."""

    call: str  # the Worker method (or "startup") the ranks were running
    timeout_s: float
    died: dict[int, str] = field(default_factory=dict)  # rank -> describe_exit(...)
    raised: dict[int, str] = field(default_factory=dict)  # rank -> "RuntimeError: ..."
    silent: list[int] = field(default_factory=list)  # ranks with no answer when the engine gave up
    timed_out: bool = False  # no rank failed: the call outlasted --distributed-timeout
    config_error: Exception | None = None  # a worker's ConfigError: raised as itself (a flag to fix)

    def __bool__(self) -> bool:
        return bool(self.died or self.raised or self.timed_out)

    def resolved(self, rank: int) -> bool:
        return rank in self.died or rank in self.raised

    def error(self) -> Exception:
        """The worker's ConfigError if one was raised, else an EngineDeadError naming the ranks."""
        if self.config_error is not None:
            return self.config_error
        parts = [f"rank {rank} died ({how})" for rank, how in sorted(self.died.items())]
        parts += [f"rank {rank} raised {what}" for rank, what in sorted(self.raised.items())]
        why = (
            f"within --distributed-timeout={self.timeout_s:g}s"
            if self.timed_out
            else "(hung, or blocked in a collective on a failed peer)"
        )
        parts += [f"rank {rank} did not answer {why}" for rank in sorted(self.silent)]
        hint = " If steps are legitimately this slow, raise --distributed-timeout." if self.timed_out else ""
        return EngineDeadError(
            f"Tensor-parallel worker failure during {self.call}: {'; '.join(parts)}. "
            f"The engine has stopped every worker and cannot serve; restart it.{hint}"
        )
