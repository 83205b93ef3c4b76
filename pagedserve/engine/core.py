"""EngineCore: owns the scheduler, the KV-cache manager and the executor. One `step()` is
schedule -> execute -> update. Only EngineCoreRequest / EngineCoreOutputs cross its boundary."""
import time

from pagedserve.config import EngineConfig, KVCacheConfig
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request
from pagedserve.core.scheduler import Scheduler
from pagedserve.core.swap import SwapSpace
from pagedserve.engine.tokenizer import load_tokenizer
from pagedserve.executor.base import get_executor_class
from pagedserve.logger import init_logger
from pagedserve.protocol import EngineCoreOutputs, EngineCoreRequest, SchedulerStats
from pagedserve.sizing import check_fits, kv_cache_config, max_concurrency
from pagedserve.structured_output.manager import StructuredOutputManager
from pagedserve.utils import format_bytes

logger = init_logger(__name__)


class EngineCore:
    """Runs the model on whatever requests were added. Not thread-safe: one caller drives it."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.executor = get_executor_class(config)(config)
        try:
            self.kv_cache_config = self._size_kv_cache()
            self.executor.initialize_kv_cache(self.kv_cache_config.num_blocks,
                                              self.kv_cache_config.num_host_blocks)
        except BaseException:
            self.executor.shutdown()  # no worker outlives a failed start
            raise
        kv = self.kv_cache_config
        swap_space = SwapSpace(kv.num_host_blocks) if kv.num_host_blocks else None
        # NOTE: the grammars live here, next to the scheduler (vLLM v1's choice): the matchers advance where
        # the sampled tokens arrive, and the workers only get each step's bitmask.
        self.structured_output = StructuredOutputManager(lambda: load_tokenizer(config.model),
                                                         config.model.vocab_size)
        self.scheduler = Scheduler(config.scheduler, KVCacheManager(kv.num_blocks, kv.block_size,
                                                                    config.cache.enable_prefix_caching),
                                   swap_space, structured_output=self.structured_output)

    def _size_kv_cache(self) -> KVCacheConfig:
        cache, block_size = self.config.cache, self.config.cache.block_size
        bytes_per_block = self.executor.kv_cache_bytes_per_block()
        if cache.num_gpu_blocks_override is not None:
            num_blocks, source = cache.num_gpu_blocks_override, "num_gpu_blocks_override"
            weights = None
        else:
            report = self.executor.determine_kv_memory()
            # NOTE: the same arithmetic as `pagedserve plan` (sizing.py), so its figures match this log.
            num_blocks = kv_cache_config(report.kv_cache_bytes, bytes_per_block, block_size).num_blocks
            source = report.detail
            weights = report.weights_bytes
        kv = KVCacheConfig(num_blocks, block_size, bytes_per_block, cache.swap_space_bytes // bytes_per_block)
        max_model_len = self.config.model.max_model_len
        if weights is not None:
            logger.info("Model weights: %s.", format_bytes(weights))
        logger.info("KV cache (%s): %s per token, %s per block of %d tokens, %d blocks (+1 reserved), "
                    "%s in all, capacity %d tokens.", source, format_bytes(bytes_per_block // block_size),
                    format_bytes(bytes_per_block), block_size, num_blocks - 1,
                    format_bytes(bytes_per_block * num_blocks), kv.capacity_tokens)
        logger.info("Maximum concurrency for %d tokens per request: %.2fx", max_model_len,
                    max_concurrency(kv, max_model_len))
        logger.info("Swap space: %d host blocks (%s, --swap-space); prefix caching %s.", kv.num_host_blocks,
                    format_bytes(kv.num_host_blocks * bytes_per_block),
                    "on" if cache.enable_prefix_caching else "off (--no-enable-prefix-caching)")
        check_fits(kv, max_model_len)
        return kv

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request(request))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model, update. The stats are taken after the update (finished requests'
        blocks already freed)."""
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs()
        timestamp = time.time()
        scheduler_output = self.scheduler.schedule()
        # A request resumed after preemption is "new" to the workers again, but it left the queue before.
        first_scheduled = [new.request_id for new in scheduler_output.scheduled_new_reqs
                           if self.scheduler.requests[new.request_id].num_preemptions == 0]
        if scheduler_output.is_empty and not scheduler_output.has_block_ops:
            self.structured_output.wait_for_compile(timeout_s=0.05)  # only grammars being compiled are left
        runner_output = self.executor.execute_model(scheduler_output)
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        return EngineCoreOutputs(outputs, self.scheduler.get_stats(), timestamp, first_scheduled)

    def reset_prefix_cache(self) -> bool:
        """Make every cached KV block unfindable (blocks in use stay with their requests)."""
        logger.info("Prefix cache reset: %d cached blocks forgotten.", self.scheduler.reset_prefix_cache())
        return True

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.get_stats()

    def shutdown(self) -> None:
        self.structured_output.shutdown()
        self.executor.shutdown()
