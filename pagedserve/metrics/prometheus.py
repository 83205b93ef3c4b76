"""Prometheus metrics with vLLM's names under a `pagedserve:` prefix, in a registry of their own."""

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pagedserve.config import CacheConfig
from pagedserve.metrics.loggers import StatLoggerBase
from pagedserve.metrics.stats import IterationStats
from pagedserve.protocol import FinishReason, SchedulerStats

# vLLM's buckets, in seconds.
_TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
_ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
_LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


class PrometheusStatLogger(StatLoggerBase):
    """Every metric carries a `model_name` label. `render()` gives the /metrics body."""

    def __init__(self, model_name: str) -> None:
        # NOTE: no `_created` series: they double the output and no dashboard of vLLM's uses them.
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry()
        labels, registry = ["model_name"], self.registry
        self.running = Gauge(
            "pagedserve:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            registry=registry,
        ).labels(model_name)
        self.waiting = Gauge(
            "pagedserve:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels,
            registry=registry,
        ).labels(model_name)
        self.kv_usage = Gauge(
            "pagedserve:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            labels,
            registry=registry,
        ).labels(model_name)
        self.preemptions = Counter(
            "pagedserve:num_preemptions",
            "Cumulative number of preemptions from the engine.",
            labels,
            registry=registry,
        ).labels(model_name)
        self.recomputed = Counter(
            "pagedserve:num_recomputed_tokens",
            "Cumulative number of computed tokens whose KV cache preemptions dropped (computed again).",
            labels,
            registry=registry,
        ).labels(model_name)
        self.rejected = Counter(
            "pagedserve:num_requests_rejected",
            "Requests refused by admission control (queue limits, queue time): 503.",
            labels,
            registry=registry,
        ).labels(model_name)
        self.prompt_tokens = Counter(
            "pagedserve:prompt_tokens", "Number of prefill tokens processed.", labels, registry=registry
        ).labels(model_name)
        self.generation_tokens = Counter(
            "pagedserve:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            registry=registry,
        ).labels(model_name)
        success = Counter(
            "pagedserve:request_success",
            "Count of finished requests, by finish reason.",
            labels + ["finished_reason"],
            registry=registry,
        )
        self.success = {str(reason): success.labels(model_name, str(reason)) for reason in FinishReason}
        self.ttft = self._histogram(
            "time_to_first_token_seconds", "Time to first token", _TTFT_BUCKETS, model_name
        )
        self.itl = self._histogram(
            "inter_token_latency_seconds", "Inter-token latency", _ITL_BUCKETS, model_name
        )
        self.e2e = self._histogram(
            "e2e_request_latency_seconds", "End-to-end request latency", _LATENCY_BUCKETS, model_name
        )
        self.queue_time = self._histogram(
            "request_queue_time_seconds", "Time spent waiting in the queue", _LATENCY_BUCKETS, model_name
        )
        self.last_preemptions_total = 0
        self.last_recomputed_total = 0
        # The engine's counts of these (SchedulerStats fields, same names) are cumulative too.
        self.cumulative = {
            name: Counter(f"pagedserve:{name}", description, labels, registry=registry).labels(model_name)
            for name, description in _CUMULATIVE_STATS.items()
        }
        self.last_cumulative = dict.fromkeys(self.cumulative, 0)

    def record_cache_config(
        self, cache: CacheConfig, cache_dtype: str, num_gpu_blocks: int, num_cpu_blocks: int
    ) -> None:
        """`pagedserve:cache_config_info`, vLLM's `vllm:cache_config_info`: a gauge at 1 whose labels are the
        sized KV cache (`cache_dtype` resolved: auto is the model's dtype)."""
        labels = {
            "block_size": cache.block_size,
            "cache_dtype": cache_dtype,
            "num_gpu_blocks": num_gpu_blocks,
            "num_cpu_blocks": num_cpu_blocks,
            "enable_prefix_caching": cache.enable_prefix_caching,
            "gpu_memory_utilization": cache.gpu_memory_utilization,
            "swap_space_bytes": cache.swap_space_bytes,
            "calculate_kv_scales": cache.calculate_kv_scales,
        }
        Gauge(
            "pagedserve:cache_config_info",
            "Information of the KV cache configuration.",
            list(labels),
            registry=self.registry,
        ).labels(*map(str, labels.values())).set(1)

    def _histogram(self, name: str, description: str, buckets: list[float], model_name: str) -> Histogram:
        return Histogram(
            f"pagedserve:{name}",
            f"Histogram of {description.lower()} in seconds.",
            ["model_name"],
            buckets=buckets,
            registry=self.registry,
        ).labels(model_name)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats) -> None:
        if scheduler_stats is not None:
            self.running.set(scheduler_stats.num_running_reqs)
            self.waiting.set(scheduler_stats.num_waiting_reqs)
            self.kv_usage.set(scheduler_stats.kv_cache_usage)
            # The engine's count is cumulative: add what is new since the last report.
            self.preemptions.inc(max(0, scheduler_stats.num_preemptions_total - self.last_preemptions_total))
            self.last_preemptions_total = scheduler_stats.num_preemptions_total
            self.recomputed.inc(
                max(0, scheduler_stats.num_recomputed_tokens_total - self.last_recomputed_total)
            )
            self.last_recomputed_total = scheduler_stats.num_recomputed_tokens_total
            for name, counter in self.cumulative.items():
                total = getattr(scheduler_stats, name)
                counter.inc(max(0, total - self.last_cumulative[name]))
                self.last_cumulative[name] = total
        self.rejected.inc(iteration_stats.num_rejected_requests)
        self.prompt_tokens.inc(iteration_stats.num_prompt_tokens)
        self.generation_tokens.inc(iteration_stats.num_generation_tokens)
        for histogram, values in (
            (self.ttft, iteration_stats.time_to_first_tokens),
            (self.itl, iteration_stats.inter_token_latencies),
            (self.queue_time, iteration_stats.queue_times),
        ):
            for value in values:
                histogram.observe(value)
        for finished in iteration_stats.finished_requests:
            self.success[finished.finish_reason].inc()
            self.e2e.observe(finished.e2e_latency)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return prometheus_client.generate_latest(self.registry)


CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST

_CUMULATIVE_STATS = {
    "prefix_cache_queries": "Prefix-cache queries, in tokens.",
    "prefix_cache_hits": "Prefix-cache hits, in tokens.",
    "spec_decode_num_drafts": "Speculative decoding: steps that verified draft tokens, per request.",
    "spec_decode_num_draft_tokens": "Speculative decoding: draft tokens verified.",
    "spec_decode_num_accepted_tokens": "Speculative decoding: draft tokens accepted.",
}
