"""One engine's Prometheus series (EngineMetrics): the families with vLLM's names, registered once and
labelled per engine (`model_name`, `engine`), and each stats report recorded into them (cumulative engine
counts turned into counter increments)."""

import time
from collections.abc import Sequence
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from pagedserve.config import CacheConfig
from pagedserve.config.kv_layout import KVCacheLayout
from pagedserve.metrics.prometheus_buckets import (
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    LATENCY_BUCKETS,
    N_BUCKETS,
    TTFT_BUCKETS,
    one_two_five,
)
from pagedserve.metrics.stats import IterationStats
from pagedserve.protocol import FinishReason, SchedulerStats

M = TypeVar("M", bound=MetricWrapperBase)


class EngineMetrics:
    """One engine's series of every family (`families`: the families by name, shared by the engines)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        families: dict[str, MetricWrapperBase],
        label_values: list[str],
        max_model_len: int,
        max_loras: int | None,
    ) -> None:
        self.registry = registry
        self.families = families
        self.label_values = label_values
        # NOTE: /metrics lists the families in the order they are registered here.
        self._register_scheduler_metrics()
        self._register_latency_histograms()
        self._register_request_histograms(max_model_len)
        self.last_preemptions_total = 0
        self.last_recomputed_total = 0
        # The engine's counts of these (SchedulerStats fields, same names) are cumulative too.
        self.cumulative = {
            name: self._counter(name, description) for name, description in _CUMULATIVE_STATS.items()
        }
        self.last_cumulative = dict.fromkeys(self.cumulative, 0)
        self.max_loras = max_loras
        # --enable-lora: one series, labelled with the adapters running and waiting now (vLLM's gauge).
        self.lora_info = (
            None
            if max_loras is None
            else self._family(
                Gauge,
                "lora_requests_info",
                "Running and waiting LoRA adapters (comma-separated names); the value is when it was set.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
            )
        )
        self.lora_labels: tuple[str, ...] | None = None

    def _register_scheduler_metrics(self) -> None:
        """The queues and the KV cache now, and the running totals of tokens and requests."""
        self.running = self._gauge("num_requests_running", "Number of requests in model execution batches.")
        self.waiting = self._gauge("num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = self._gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = self._counter(
            "num_preemptions", "Cumulative number of preemptions from the engine."
        )
        self.recomputed = self._counter(
            "num_recomputed_tokens",
            "Cumulative number of computed tokens whose KV cache preemptions dropped (computed again).",
        )
        self.rejected = self._counter(
            "num_requests_rejected", "Requests refused by admission control (queue limits, queue time): 503."
        )
        self.prompt_tokens = self._counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = self._counter("generation_tokens", "Number of generation tokens processed.")
        success = self._family(
            Counter,
            "request_success",
            "Count of successfully processed requests, by finish reason.",
            ["finished_reason"],
        )
        self.success = {str(r): success.labels(*self.label_values, str(r)) for r in FinishReason}

    def _register_latency_histograms(self) -> None:
        """Per token and per request, in seconds (vLLM's buckets)."""
        self.ttft = self._seconds("time_to_first_token_seconds", "time to first token", TTFT_BUCKETS)
        self.itl = self._seconds("inter_token_latency_seconds", "inter-token latency", ITL_BUCKETS)
        self.tpot = self._seconds(
            "request_time_per_output_token_seconds", "time per output token, per request", ITL_BUCKETS
        )
        self.e2e = self._seconds("e2e_request_latency_seconds", "end-to-end request latency", LATENCY_BUCKETS)
        self.queue_time = self._seconds("request_queue_time_seconds", "time spent waiting", LATENCY_BUCKETS)
        self.phases = {
            phase: self._seconds(f"request_{phase}_time_seconds", f"time spent in {phase}", LATENCY_BUCKETS)
            for phase in ("inference", "prefill", "decode")
        }

    def _register_request_histograms(self, max_model_len: int) -> None:
        """Token counts per request (buckets up to the context length) and per engine step."""
        token_buckets = one_two_five(max_model_len)
        self.request_prompt_tokens = self._histogram(
            "request_prompt_tokens", "Number of prefill tokens processed, per request.", token_buckets
        )
        self.request_generation_tokens = self._histogram(
            "request_generation_tokens", "Number of generation tokens processed, per request.", token_buckets
        )
        self.request_max_tokens = self._histogram(
            "request_params_max_tokens", "The max_tokens request parameter.", token_buckets
        )
        self.request_n = self._histogram("request_params_n", "The n request parameter.", N_BUCKETS)
        self.iteration_tokens = self._histogram(
            "iteration_tokens_total", "Number of tokens per engine step.", ITERATION_TOKEN_BUCKETS
        )

    def _family(
        self, kind: type[M], name: str, description: str, labels: Sequence[str] = (), **kwargs: Any
    ) -> M:
        """The family `pagedserve:<name>` (labels: model_name, engine, then `labels`), made by the first
        engine that asks."""
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = kind(
                f"pagedserve:{name}",
                description,
                ["model_name", "engine", *labels],
                registry=self.registry,
                **kwargs,
            )
        assert isinstance(family, kind)
        return family

    def _gauge(self, name: str, description: str) -> Gauge:
        return self._family(Gauge, name, description).labels(*self.label_values)

    def _counter(self, name: str, description: str) -> Counter:
        return self._family(Counter, name, description).labels(*self.label_values)

    def _histogram(self, name: str, description: str, buckets: Sequence[float]) -> Histogram:
        return self._family(Histogram, name, description, buckets=buckets).labels(*self.label_values)

    def _seconds(self, name: str, what: str, buckets: Sequence[float]) -> Histogram:
        return self._histogram(name, f"Histogram of {what} in seconds.", buckets)

    def record_cache_config(
        self, cache: CacheConfig, cache_dtype: str, num_gpu_blocks: int, num_cpu_blocks: int
    ) -> None:
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
        self._family(
            Gauge, "cache_config_info", "Information of the KV cache configuration.", list(labels)
        ).labels(*self.label_values, *map(str, labels.values())).set(1)

    def record_kv_layout(self, layout: KVCacheLayout) -> None:
        labels = {
            "kind": "mla" if layout.model.latent else "kv",
            "values_per_token_per_layer": layout.model.values_per_token,
            "bytes_per_token": layout.bytes_per_token,
        }
        self._family(
            Gauge, "kv_cache_layout_info", "What the KV cache stores per token.", list(labels)
        ).labels(*self.label_values, *map(str, labels.values())).set(1)

    def record_model_weight_bytes(self, num_bytes: int) -> None:
        self._gauge("model_weight_bytes", "Bytes of model weights resident on the engine's devices.").set(
            num_bytes
        )

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats) -> None:
        if scheduler_stats is not None:
            self._record_scheduler(scheduler_stats)
        self.rejected.inc(iteration_stats.num_rejected_requests)
        self.prompt_tokens.inc(iteration_stats.num_prompt_tokens)
        self.generation_tokens.inc(iteration_stats.num_generation_tokens)
        for histogram, values in (
            (self.ttft, iteration_stats.time_to_first_tokens),
            (self.itl, iteration_stats.inter_token_latencies),
            (self.queue_time, iteration_stats.queue_times),
            (self.iteration_tokens, iteration_stats.num_iteration_tokens),
        ):
            for value in values:
                histogram.observe(value)
        for finished in iteration_stats.finished_requests:
            self.success[finished.finish_reason].inc()
            self.e2e.observe(finished.e2e_latency)
            self.request_prompt_tokens.observe(finished.num_prompt_tokens)
            self.request_generation_tokens.observe(finished.num_generation_tokens)
            self.request_n.observe(finished.n)
            if finished.max_tokens is not None:
                self.request_max_tokens.observe(finished.max_tokens)
            self.phases["inference"].observe(finished.inference_time)
            self.phases["prefill"].observe(finished.prefill_time)
            self.phases["decode"].observe(finished.decode_time)
            if finished.time_per_output_token is not None:
                self.tpot.observe(finished.time_per_output_token)

    def _record_scheduler(self, stats: SchedulerStats) -> None:
        self.running.set(stats.num_running_reqs)
        self.waiting.set(stats.num_waiting_reqs)
        self.kv_usage.set(stats.kv_cache_usage)
        # The engine's counts are cumulative: add what is new since the last report.
        self.preemptions.inc(max(0, stats.num_preemptions_total - self.last_preemptions_total))
        self.last_preemptions_total = stats.num_preemptions_total
        self.recomputed.inc(max(0, stats.num_recomputed_tokens_total - self.last_recomputed_total))
        self.last_recomputed_total = stats.num_recomputed_tokens_total
        for name, counter in self.cumulative.items():
            total = getattr(stats, name)
            counter.inc(max(0, total - self.last_cumulative[name]))
            self.last_cumulative[name] = total
        if self.lora_info is not None:
            labels = (
                *self.label_values,
                str(self.max_loras),
                ",".join(stats.waiting_lora_adapters),
                ",".join(stats.running_lora_adapters),
            )
            if self.lora_labels is not None and self.lora_labels != labels:
                self.lora_info.remove(*self.lora_labels)  # NOTE: this engine's last series only
            self.lora_info.labels(*labels).set(time.time())
            self.lora_labels = labels


_CUMULATIVE_STATS = {
    "num_priority_preemptions": "Preemptions for a more urgent waiting request (--scheduling-policy priority).",
    "prefix_cache_queries": "Prefix-cache queries, in tokens.",
    "prefix_cache_hits": "Prefix-cache hits, in tokens.",
    "spec_decode_num_drafts": "Speculative decoding: steps that verified draft tokens, per request.",
    "spec_decode_num_draft_tokens": "Speculative decoding: draft tokens verified.",
    "spec_decode_num_accepted_tokens": "Speculative decoding: draft tokens accepted.",
    "num_images_encoded": "Image models: images the vision encoder ran on (cached ones are not run again).",
    "encoder_seconds": "Image models: seconds the vision encoder ran.",
}
