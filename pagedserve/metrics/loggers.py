"""Stat loggers: each receives every batch of statistics; `log()` is called every few seconds."""

import time
from abc import ABC, abstractmethod

from pagedserve.logger import init_logger
from pagedserve.metrics.stats import EngineStats, IterationStats
from pagedserve.protocol import SchedulerStats

logger = init_logger(__name__)


class StatLoggerBase(ABC):
    """Interface of a consumer of serving statistics. Called from the event loop only."""

    @abstractmethod
    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats, engine_index: int = 0
    ) -> None:
        """Account for one batch of engine-core outputs (`scheduler_stats` is the engine's latest view;
        `engine_index`: which data-parallel replica's)."""

    def log(self) -> None:
        """Periodic hook (every PAGEDSERVE_LOG_STATS_INTERVAL seconds); nothing by default."""


class LoggingStatLogger(StatLoggerBase):
    """One INFO line per interval while the engine is busy: throughputs, queue, KV usage, preemptions."""

    def __init__(self) -> None:
        self.engines = EngineStats()
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.last_log_time = time.monotonic()
        self.last_preemptions_total = 0
        self.last_prefix_cache = (0, 0)  # cumulative (queries, hits) at the last log line
        self.last_spec = (0, 0)  # cumulative (draft tokens, accepted) at the last log line

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats, engine_index: int = 0
    ) -> None:
        self.engines.update(scheduler_stats, engine_index)
        self.num_prompt_tokens += iteration_stats.num_prompt_tokens
        self.num_generation_tokens += iteration_stats.num_generation_tokens

    def log(self) -> None:
        now = time.monotonic()
        elapsed, self.last_log_time = now - self.last_log_time, now
        stats = self.engines.combined()
        active = stats.num_running_reqs or stats.num_waiting_reqs
        if not (active or self.num_prompt_tokens or self.num_generation_tokens):
            return  # idle: nothing to say
        queries = stats.prefix_cache_queries - self.last_prefix_cache[0]
        hits = stats.prefix_cache_hits - self.last_prefix_cache[1]
        drafted = stats.spec_decode_num_draft_tokens - self.last_spec[0]
        accepted = stats.spec_decode_num_accepted_tokens - self.last_spec[1]
        spec = f", Draft acceptance rate: {100 * accepted / drafted:.1f}% of {drafted}" if drafted else ""
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: "
            "%.1f%%, Preemptions: %d (total %d)%s",
            self.num_prompt_tokens / elapsed,
            self.num_generation_tokens / elapsed,
            stats.num_running_reqs,
            stats.num_waiting_reqs,
            stats.kv_cache_usage * 100,
            100 * hits / queries if queries else 0.0,
            stats.num_preemptions_total - self.last_preemptions_total,
            stats.num_preemptions_total,
            spec,
        )
        self.last_spec = (stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens)
        self.last_prefix_cache = (stats.prefix_cache_queries, stats.prefix_cache_hits)
        self.num_prompt_tokens = self.num_generation_tokens = 0
        self.last_preemptions_total = stats.num_preemptions_total
