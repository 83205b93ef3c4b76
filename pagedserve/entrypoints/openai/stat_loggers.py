"""The API server's consumers of an engine's statistics (Prometheus at /metrics, the dashboard, the log
line), one set per engine: the one-model server's, and each loaded model's in a pool."""

from dataclasses import dataclass

from pagedserve.config import EngineConfig
from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.metrics.dashboard import DashboardStatLogger
from pagedserve.metrics.loggers import LoggingStatLogger, StatLoggerBase
from pagedserve.metrics.prometheus import PrometheusStatLogger


@dataclass(frozen=True)
class StatLoggers:
    """The server's consumers of statistics: Prometheus (/metrics), the dashboard, the log line."""

    metrics: PrometheusStatLogger
    dashboard: DashboardStatLogger
    log_line: LoggingStatLogger | None

    def all(self) -> list[StatLoggerBase]:
        return [self.metrics, self.dashboard, *([self.log_line] if self.log_line else [])]

    @classmethod
    def for_config(cls, config: EngineConfig, disable_log_stats: bool) -> "StatLoggers":
        metrics = PrometheusStatLogger(
            config.model.served_model_name,
            config.model.max_model_len,
            num_engines=config.parallel.data_parallel_size,
            max_loras=None if config.lora is None else config.lora.max_loras,
        )
        return cls(metrics, DashboardStatLogger(), None if disable_log_stats else LoggingStatLogger())


def record_engine(loggers: StatLoggers, engine: AsyncLLM) -> None:
    """The engine's KV cache and weights, as its handshake reported them, in /metrics."""
    handshake, config = engine.handshake, engine.config
    assert handshake is not None, "AsyncLLM.create returns once the engine's handshake arrived"
    cache_dtype = config.model.dtype if config.cache.cache_dtype == "auto" else config.cache.cache_dtype
    loggers.metrics.record_cache_config(
        config.cache, cache_dtype, handshake.num_blocks - 1, handshake.num_host_blocks
    )
    loggers.metrics.record_kv_layout(config.kv_layout)
    loggers.metrics.record_model_weight_bytes(handshake.model_weight_bytes)
