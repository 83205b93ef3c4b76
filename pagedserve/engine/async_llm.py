"""AsyncLLM: the engine behind the API server. Tokenizes, detokenizes and applies stop strings in this
process; the EngineCore runs its busy loop in another (core_proc.py) behind an MPClient."""
import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from pagedserve.config import EngineConfig
from pagedserve.engine.core_client import MPClient
from pagedserve.engine.core_proc import EngineCoreHandshake
from pagedserve.engine.input_processor import InputProcessor, PromptType, split_samples
from pagedserve.engine.output_processor import OutputProcessor
from pagedserve.engine.tokenizer import load_tokenizer
from pagedserve.errors import EngineDeadError, InvalidRequestError
from pagedserve.logger import init_logger
from pagedserve.metrics.loggers import StatLoggerBase
from pagedserve.metrics.stats import IterationStats
from pagedserve.outputs import RequestOutput
from pagedserve.protocol import EngineCoreOutputs, EngineCoreRequest, SchedulerStats
from pagedserve.sampling_params import SamplingParams

logger = init_logger(__name__)

_MAX_LOGGED_REQUESTS = 20  # in-flight requests listed by name when the engine dies


class AsyncLLM:
    """Serves many concurrent `generate()` calls from one event loop. Build it with `create()`."""

    def __init__(self, config: EngineConfig, stat_loggers: list[StatLoggerBase], log_requests: bool,
                 log_stats_interval_s: float) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.model)
        self.input_processor = InputProcessor(config.model, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.stat_loggers = stat_loggers
        self.log_requests = log_requests
        self.log_stats_interval_s = log_stats_interval_s
        self.engine_core = MPClient(config)
        self.handshake: EngineCoreHandshake | None = None
        self.dead_error: EngineDeadError | None = None
        self.dead_event = asyncio.Event()  # set once the engine has died
        self._queues: dict[str, asyncio.Queue[RequestOutput | Exception]] = {}
        self._last_scheduler_stats = SchedulerStats()
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def create(cls, config: EngineConfig, stat_loggers: list[StatLoggerBase], log_requests: bool = True,
                     log_stats_interval_s: float = 10.0) -> "AsyncLLM":
        """Start the engine process and wait until it is ready. Raises ConfigError (bad settings) or
        EngineDeadError (failed to start); the process is gone either way."""
        engine = cls(config, stat_loggers, log_requests, log_stats_interval_s)
        try:
            engine.handshake = await engine.engine_core.wait_until_ready()
        except BaseException:
            engine.shutdown()
            raise
        engine._tasks = [asyncio.create_task(engine._run_output_handler()),
                         asyncio.create_task(engine._run_stat_logging())]
        return engine

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    @property
    def errored(self) -> bool:
        return self.dead_error is not None or not self.engine_core.is_alive()

    def check_health(self) -> None:
        """Raises EngineDeadError if the engine process is gone."""
        if self.errored:
            raise self.dead_error or self.engine_core.dead_error()

    def process_inputs(self, request_id: str, prompt: PromptType, params: SamplingParams
                       ) -> EngineCoreRequest:
        """Validate and tokenize without queuing anything (so a request of several prompts can be checked
        whole before any of it reaches the engine). Raises InvalidRequestError."""
        return self.input_processor.process(request_id, prompt, params)[1]

    async def generate(self, prompt: PromptType | EngineCoreRequest, params: SamplingParams, request_id: str
                       ) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's outputs (cumulative, deltas or only the final one, per
        `params.output_kind`), the last with `finished=True`. `prompt` may be what process_inputs()
        returned for the same `params` and `request_id`. Raises InvalidRequestError before anything
        reaches the engine, EngineDeadError if the engine dies meanwhile. Closing or cancelling the
        generator before the end aborts the request in the engine at once (its KV blocks are freed)."""
        self.check_health()
        if isinstance(prompt, EngineCoreRequest):
            text, request = None, prompt
        else:
            text, request = self.input_processor.process(request_id, prompt, params)
        if request_id in self._queues:
            raise InvalidRequestError(f"Request id {request_id!r} is already in use.", param="request_id")
        child_ids = self.output_processor.add_request(request_id, text, request.prompt_token_ids,
                                                      request.sampling_params, request.arrival_time)
        queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self._queues[request_id] = queue
        finished = False
        try:
            await self.engine_core.add_requests(split_samples(request, child_ids))
            if self.log_requests:
                logger.info("Added request %s: %d prompt tokens, %s.", request_id,
                            len(request.prompt_token_ids), _describe(request.sampling_params))
            while not finished:
                item = await queue.get()
                if isinstance(item, Exception):
                    finished = True  # the engine is gone: nothing to abort
                    raise item
                finished = item.finished
                yield item
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                await self.abort(request_id)

    async def abort(self, request_id: str) -> None:
        """End a request wherever it is; a no-op for one that already ended."""
        stats = IterationStats()
        child_ids = self.output_processor.abort_request(request_id, stats)
        self._queues.pop(request_id, None)
        if not child_ids:
            return
        self._record(None, stats)
        if self.log_requests:
            logger.info("Aborted request %s.", request_id)
        if self.engine_core.is_alive():
            await self.engine_core.abort_requests(child_ids)

    async def _run_output_handler(self) -> None:
        """Route the engine's outputs to the requests' queues, until the engine dies."""
        try:
            while True:
                core_outputs = await self.engine_core.get_output()
                to_abort = self._process_outputs(core_outputs)
                if to_abort:
                    await self.engine_core.abort_requests(to_abort)
        except EngineDeadError as exc:
            self._on_engine_dead(exc)
        except Exception as exc:  # a bug here would hang every request: fail them all loudly instead
            logger.exception("The output handler failed.")
            self._on_engine_dead(EngineDeadError(f"The engine's output handler failed: {exc!r}"))

    def _process_outputs(self, core_outputs: EngineCoreOutputs) -> list[str]:
        stats = IterationStats()
        request_outputs, to_abort = self.output_processor.process_outputs(core_outputs, stats)
        for output in request_outputs:
            queue = self._queues.get(output.request_id)
            if queue is not None:
                queue.put_nowait(output)
        self._record(core_outputs.scheduler_stats, stats)
        return to_abort

    def _record(self, scheduler_stats: SchedulerStats | None, stats: IterationStats) -> None:
        if scheduler_stats is not None:
            self._last_scheduler_stats = scheduler_stats
        for stat_logger in self.stat_loggers:
            stat_logger.record(scheduler_stats, stats)

    async def _run_stat_logging(self) -> None:
        while True:
            await asyncio.sleep(self.log_stats_interval_s)
            for stat_logger in self.stat_loggers:
                stat_logger.log()

    def _on_engine_dead(self, error: EngineDeadError) -> None:
        """Fail every request in flight (none may hang) and say in the log what was lost."""
        self.dead_error = error
        states = list(self.output_processor.requests.values())
        stats = self._last_scheduler_stats
        details = ", ".join(f"{s.request_id} ({len(s.prompt_token_ids)} prompt + "
                            f"{sum(len(x.token_ids) for x in s.samples)} generated tokens)"
                            for s in states[:_MAX_LOGGED_REQUESTS])
        more = f" and {len(states) - _MAX_LOGGED_REQUESTS} more" if len(states) > _MAX_LOGGED_REQUESTS else ""
        logger.error("%s %d request(s) in flight (engine at its last step: %d running, %d waiting, KV cache "
                     "%.1f%% used) fail: %s%s.", error, len(states), stats.num_running_reqs,
                     stats.num_waiting_reqs, stats.kv_cache_usage * 100, details or "none", more)
        for queue in self._queues.values():
            queue.put_nowait(error)
        self._queues.clear()
        self.output_processor.requests.clear()
        self.output_processor.child_to_parent.clear()
        self.dead_event.set()

    def shutdown(self) -> None:
        """Stop the background tasks and the engine process."""
        for task in self._tasks:
            task.cancel()
        self.engine_core.shutdown()


def _describe(params: SamplingParams) -> str:
    return (f"n={params.n}, max_tokens={params.max_tokens}, temperature={params.temperature}, "
            f"top_p={params.top_p}, seed={params.seed}")
