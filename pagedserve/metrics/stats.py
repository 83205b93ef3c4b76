"""What the frontend measures from the engine-core outputs, one batch of outputs at a time."""

from dataclasses import dataclass, field
from typing import Any

from pagedserve.protocol import SchedulerStats


@dataclass(slots=True)
class FinishedRequestStats:
    """One request that ended (its first sample's reason stands for the request)."""

    finish_reason: str  # stop | length | abort | error
    e2e_latency: float  # seconds from arrival to the end
    num_prompt_tokens: int
    num_generation_tokens: int
    n: int  # the samples it returns
    max_tokens: int | None
    # Its phases after the queue, in seconds (vLLM's): prefill from first scheduled to the first token,
    # then decode until the end (inference = prefill + decode); 0 for a phase it never reached. (The
    # queue time is measured when the request is first scheduled: IterationStats.queue_times.)
    prefill_time: float = 0.0
    decode_time: float = 0.0

    @property
    def inference_time(self) -> float:
        return self.prefill_time + self.decode_time

    @property
    def time_per_output_token(self) -> float | None:
        """Mean seconds per output token after the first; None with fewer than two tokens."""
        tokens = self.num_generation_tokens - self.n
        return self.decode_time / tokens if tokens > 0 else None


@dataclass
class IterationStats:
    """What one batch of engine-core outputs added: token counts and latency samples, in seconds.
    Prompt tokens are counted when a request's first token arrives (its prefill is then done)."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    queue_times: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    num_iteration_tokens: list[int] = field(default_factory=list)  # tokens computed, per engine step
    num_rejected_requests: int = 0  # refused by admission control (queue full, or waited too long)


class EngineStats:
    """The latest SchedulerStats of each engine (data-parallel replica), and their sum for one view."""

    def __init__(self) -> None:
        self.latest: dict[int, SchedulerStats] = {}

    def update(self, stats: SchedulerStats | None, engine_index: int) -> None:
        if stats is not None:
            self.latest[engine_index] = stats

    def combined(self) -> SchedulerStats:
        """Counts summed over the engines, KV usage their mean, adapters their union."""
        engines = list(self.latest.values())
        if len(engines) <= 1:
            return engines[0] if engines else SchedulerStats()
        fields: dict[str, Any] = {}
        for name in SchedulerStats.__struct_fields__:
            values = [getattr(stats, name) for stats in engines]
            if name == "kv_cache_usage":
                fields[name] = sum(values) / len(values)
            elif isinstance(values[0], list):
                fields[name] = sorted({item for value in values for item in value})
            else:
                fields[name] = sum(values)
        return SchedulerStats(**fields)
