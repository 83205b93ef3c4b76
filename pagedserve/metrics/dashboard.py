"""Totals for the live dashboard (GET /dashboard/state): the same statistics the Prometheus logger gets,
kept as plain cumulative numbers; the page derives rates and mean latencies from two polls."""

import time
from typing import Any

import msgspec

from pagedserve.metrics.loggers import StatLoggerBase
from pagedserve.metrics.stats import EngineStats, IterationStats
from pagedserve.protocol import SchedulerStats


class DashboardStatLogger(StatLoggerBase):
    """Cumulative counters and the engine's latest scheduler stats; `state()` gives them as JSON data.
    Called from the event loop only."""

    def __init__(self) -> None:
        self.engines = EngineStats()
        self.totals: dict[str, float] = {
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "requests_finished": 0,
            "requests_rejected": 0,
            "requests_aborted": 0,
            "ttft_sum": 0.0,
            "ttft_count": 0,
            "itl_sum": 0.0,
            "itl_count": 0,
            "e2e_sum": 0.0,
            "e2e_count": 0,
        }

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats, engine_index: int = 0
    ) -> None:
        self.engines.update(scheduler_stats, engine_index)
        totals, stats = self.totals, iteration_stats
        totals["prompt_tokens"] += stats.num_prompt_tokens
        totals["generation_tokens"] += stats.num_generation_tokens
        totals["requests_rejected"] += stats.num_rejected_requests
        for name, values in (
            ("ttft", stats.time_to_first_tokens),
            ("itl", stats.inter_token_latencies),
            ("e2e", [f.e2e_latency for f in stats.finished_requests]),
        ):
            totals[f"{name}_sum"] += sum(values)
            totals[f"{name}_count"] += len(values)
        totals["requests_finished"] += len(stats.finished_requests)
        totals["requests_aborted"] += sum(1 for f in stats.finished_requests if f.finish_reason == "abort")

    def state(self) -> dict[str, Any]:
        """{"time", "scheduler": the SchedulerStats fields, "totals": the counters}."""
        return {
            "time": time.time(),
            "scheduler": msgspec.structs.asdict(self.engines.combined()),
            "totals": dict(self.totals),
        }
