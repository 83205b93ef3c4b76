"""The API server's stats: each engine replica's latest scheduler stats, every stat logger fed from the
engine's outputs and the frontend's own counts, and their periodic log line."""

import asyncio

from pagedserve.metrics.loggers import StatLoggerBase
from pagedserve.metrics.stats import EngineStats, IterationStats
from pagedserve.protocol import SchedulerStats


class StatsRecorder:
    """Use from the AsyncLLM's event loop."""

    def __init__(self, stat_loggers: list[StatLoggerBase], log_stats_interval_s: float) -> None:
        self.stat_loggers = stat_loggers
        self.log_stats_interval_s = log_stats_interval_s
        self.scheduler_stats = EngineStats()  # each replica's latest

    def record(
        self, scheduler_stats: SchedulerStats | None, stats: IterationStats, engine_index: int = 0
    ) -> None:
        self.scheduler_stats.update(scheduler_stats, engine_index)
        for stat_logger in self.stat_loggers:
            stat_logger.record(scheduler_stats, stats, engine_index)

    async def run_logging(self) -> None:
        while True:
            await asyncio.sleep(self.log_stats_interval_s)
            for stat_logger in self.stat_loggers:
                stat_logger.log()
