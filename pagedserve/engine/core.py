"""EngineCore: owns the scheduler, the KV-cache manager and the executor. One `step()` is
schedule -> execute -> update; with pipeline stages, a step of the batch queue (engine/batch_queue.py).
Only EngineCoreRequest / EngineCoreOutputs cross its boundary."""

import time
from typing import cast

from pagedserve.config import EngineConfig
from pagedserve.config.cache import KVCacheConfig
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.pooling_scheduler import PoolingScheduler
from pagedserve.core.request import Request
from pagedserve.core.sched_output import SchedulerOutput
from pagedserve.core.scheduler import Scheduler
from pagedserve.core.scheduler_state import RequestKVUsage
from pagedserve.engine.batch_queue import BatchQueue
from pagedserve.engine.block_state import snapshot_blocks
from pagedserve.engine.tokenizer import load_tokenizer
from pagedserve.envs import pp_batch_queue_enabled
from pagedserve.executor import get_executor_class
from pagedserve.logger import init_logger
from pagedserve.protocol import BlockSnapshot, EngineCoreOutputs, EngineCoreRequest, SchedulerStats
from pagedserve.sizing import size_kv_cache
from pagedserve.structured_output.manager import StructuredOutputManager
from pagedserve.utils import cdiv

logger = init_logger(__name__)


class EngineCore:
    """Runs the model on whatever requests were added. Not thread-safe: one caller drives it."""

    def __init__(self, config: EngineConfig, log_stats: bool = True) -> None:
        """`log_stats`: each step's outputs carry the scheduler's stats (a server's metrics and log line);
        the offline engine reads none, and asks for them (`get_stats`) when it wants them."""
        self.config = config
        self.log_stats = log_stats
        # NOTE: as many batches in flight as pipeline stages: each stage has one to compute.
        max_batches = config.parallel.pipeline_parallel_size if pp_batch_queue_enabled() else 1
        self.executor = get_executor_class(config)(config)
        self.sleep_level = 0  # POST /sleep's: 0 awake, 1 or 2 asleep
        # The weights every rank holds, as measured after loading (/metrics: model_weight_bytes).
        self.model_weight_bytes = sum(cast(list[int], self.executor.collective_rpc("resident_weight_bytes")))
        self.encoder_totals: tuple[int, float] = (0, 0.0)  # an image model's, as its worker last said
        self.structured_output = StructuredOutputManager(
            lambda: load_tokenizer(config.model), config.model.vocab_size
        )
        self.scheduler: Scheduler | PoolingScheduler
        self.batch_queue: BatchQueue | None = None  # pipeline stages: micro-batches in flight
        if config.model.pooling is not None:
            # NOTE: --runner pooling: whole prompts, one forward each, no KV cache to size or manage. The
            # notional blocks only size the default queue limits (twice this, admission.py): a waiting
            # prompt holds its token ids alone, so every seat's full-length prompt counts as held.
            sched = config.scheduler
            self.kv_cache_config = KVCacheConfig(
                cdiv(sched.max_num_seqs * sched.max_model_len, config.cache.block_size) + 1,
                config.cache.block_size,
                0,
            )
            self.scheduler = PoolingScheduler(config.scheduler, config.cache.block_size)
            return
        try:
            # NOTE: the same arithmetic as `pagedserve plan` (sizing.py), so its figures match the log.
            self.kv_cache_config = size_kv_cache(config, self.executor.determine_kv_memory)
            self.executor.initialize_kv_cache(
                self.kv_cache_config.num_blocks, self.kv_cache_config.num_host_blocks
            )
        except BaseException:
            self.executor.shutdown()  # no worker outlives a failed start
            raise
        kv = self.kv_cache_config
        # NOTE: the grammars live here, next to the scheduler (vLLM v1's choice): the matchers advance where
        # the sampled tokens arrive, and the workers only get each step's bitmask.
        manager = KVCacheManager(
            kv.num_blocks, config.kv_layout.groups, config.cache.enable_prefix_caching, kv.num_host_blocks
        )
        self.scheduler = Scheduler(
            config.scheduler,
            manager,
            speculative=config.speculative,
            structured_output=self.structured_output,
            max_batches_in_flight=max_batches,
            reasoning=config.reasoning,
        )
        if max_batches > 1:
            self.batch_queue = BatchQueue(self.scheduler, self.executor, max_batches, self._wait_for_compile)

    def sleep(self, level: int) -> None:
        """Free the weights and the KV cache on every rank (level 1: the checkpoint stays mapped; 2: not).
        The prefix cache is forgotten: the blocks' contents are gone. Only between requests (the API
        server refuses a sleep while requests are in flight). A failure is logged and leaves it awake
        (its answer says level 0)."""
        try:
            self.executor.collective_rpc("sleep", (level,))
        except Exception:  # NOTE: the worker frees nothing before its copy is safe (e.g. a full disk)
            logger.exception("Sleep (level %d) failed: the engine stays awake.", level)
            return
        self.scheduler.reset_prefix_cache()
        self.sleep_level = level
        logger.info("Asleep (level %d): the weights and the KV cache are freed.", level)

    def wake_up(self) -> None:
        """Load the weights and allocate the KV cache again; a no-op when awake."""
        if self.sleep_level:
            start = time.monotonic()
            self.executor.collective_rpc("wake_up")
            logger.info("Awake after %.2f s (slept at level %d).", time.monotonic() - start, self.sleep_level)
            self.sleep_level = 0

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request (waking the engine first if it sleeps). Whatever it raises, nothing of the
        request is left in the scheduler."""
        self.wake_up()
        core_request = Request(request)
        try:
            self.scheduler.add_request(core_request)
        except Exception:
            # NOTE: a half-registered request would keep the engine busy forever with nothing to run.
            self.scheduler.abort_requests([request.request_id])
            raise

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        """Requests to run, or batches in flight (their outputs, even of aborted requests, are due)."""
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model, update. The stats are taken after the update (finished requests'
        blocks already freed)."""
        if not self.has_unfinished_requests():
            return EngineCoreOutputs()
        timestamp = time.time()
        scheduler_output: SchedulerOutput | None
        if self.batch_queue is not None:
            outputs, scheduler_output = self.batch_queue.step()
        else:
            scheduler_output = self.scheduler.schedule()
            if scheduler_output.is_empty and not scheduler_output.has_block_ops:
                self._wait_for_compile()
            runner_output = self.executor.execute_model(scheduler_output)
            outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
            self.encoder_totals = runner_output.encoder_totals or self.encoder_totals
        return EngineCoreOutputs(
            outputs,
            self.get_stats() if self.log_stats else None,
            timestamp,
            scheduler_output.first_scheduled_req_ids if scheduler_output else [],
            num_scheduled_tokens=scheduler_output.total_num_scheduled_tokens if scheduler_output else 0,
        )

    def _wait_for_compile(self) -> None:
        """Nothing could be scheduled: only grammars being compiled are left (not a busy loop)."""
        self.structured_output.wait_for_compile(timeout_s=0.05)

    def reset_prefix_cache(self) -> bool:
        """Make every cached KV block unfindable (blocks in use stay with their requests)."""
        logger.info("Prefix cache reset: %d cached blocks forgotten.", self.scheduler.reset_prefix_cache())
        return True

    def get_stats(self) -> SchedulerStats:
        stats = self.scheduler.get_stats()
        stats.num_images_encoded, stats.encoder_seconds = self.encoder_totals
        return stats

    def describe(self, max_requests: int = 20) -> str:
        """The scheduler's state (queues, KV usage, the running requests) for a log."""
        return self.scheduler.describe(max_requests)

    def request_kv_usage(self, request_id: str) -> RequestKVUsage | None:
        """A live request's computed tokens and KV blocks per cache group (None once it is gone)."""
        return self.scheduler.request_kv_usage(request_id)

    def block_snapshot(self) -> BlockSnapshot:
        """The KV block pool as the dashboard draws it, and the host blocks of the swap space."""
        return snapshot_blocks(self.scheduler.block_owners())

    def shutdown(self) -> None:
        self.structured_output.shutdown()
        self.executor.shutdown()
