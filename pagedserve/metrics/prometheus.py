"""Prometheus metrics with vLLM's names and labels (`model_name`, `engine`), in a registry of their own.
Each family is exported twice from the same collectors: under the `pagedserve:` prefix and under vLLM's
`vllm:`, so that dashboards, alerts and autoscalers written for vLLM work unchanged."""

from collections.abc import Callable, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

from pagedserve.config import CacheConfig
from pagedserve.config.kv_layout import KVCacheLayout
from pagedserve.metrics.loggers import StatLoggerBase
from pagedserve.metrics.prometheus_engine import EngineMetrics
from pagedserve.metrics.stats import IterationStats
from pagedserve.protocol import SchedulerStats


class PrometheusStatLogger(StatLoggerBase):
    """Every metric carries `model_name` (the first served name) and `engine` (the engine's index: one
    series per data-parallel replica) labels. `render()` gives the /metrics body: each family under both
    prefixes."""

    def __init__(
        self, model_name: str, max_model_len: int, num_engines: int = 1, max_loras: int | None = None
    ) -> None:
        # NOTE: no `_created` series: they double the output and no dashboard of vLLM's uses them.
        prometheus_client.disable_created_metrics()
        self.model_name = model_name
        self.registry = CollectorRegistry()
        families: dict[str, MetricWrapperBase] = {}
        self.engines = [
            EngineMetrics(self.registry, families, [model_name, str(i)], max_model_len, max_loras)
            for i in range(num_engines)
        ]

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats, engine_index: int = 0
    ) -> None:
        self.engines[engine_index].record(scheduler_stats, iteration_stats)

    def record_cache_config(
        self, cache: CacheConfig, cache_dtype: str, num_gpu_blocks: int, num_cpu_blocks: int
    ) -> None:
        """`cache_config_info`: a gauge at 1 whose labels are the sized KV cache (`cache_dtype` resolved:
        auto is the model's dtype), per engine."""
        for engine in self.engines:
            engine.record_cache_config(cache, cache_dtype, num_gpu_blocks, num_cpu_blocks)

    def record_kv_layout(self, layout: KVCacheLayout) -> None:
        """`kv_cache_layout_info`: what one token stores per layer (`kind` kv: K and V per KV head, mla: one
        latent) and the KV bytes per token of a rank, per engine."""
        for engine in self.engines:
            engine.record_kv_layout(layout)

    def server_gauge(self, name: str, description: str, read: Callable[[], float]) -> None:
        """The gauge `pagedserve:<name>` of the API server's own state (not an engine's), read at each
        scrape."""
        Gauge(f"pagedserve:{name}", description, ["model_name"], registry=self.registry).labels(
            self.model_name
        ).set_function(read)

    def record_model_weight_bytes(self, num_bytes: int) -> None:
        """`model_weight_bytes`: what the model's weights hold on one engine's devices (every rank's,
        measured after loading: quantized formats count their stored blocks), per engine."""
        for engine in self.engines:
            engine.record_model_weight_bytes(num_bytes)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric, under both prefixes."""
        return prometheus_client.generate_latest(_TwoNames(self.registry))


class _TwoNames:
    """The registry's families, each followed by its twin under vLLM's `vllm:` prefix: one collection
    gives both names, so a scrape can never show the twins apart."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            yield family
            renamed = Metric(_vllm_name(family.name), family.documentation, family.type, family.unit)
            renamed.samples = [sample._replace(name=_vllm_name(sample.name)) for sample in family.samples]
            yield renamed


def _vllm_name(name: str) -> str:
    return "vllm:" + name.removeprefix("pagedserve:")


CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
