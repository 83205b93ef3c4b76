"""AsyncLLM: the engine behind the API server. Tokenizes, detokenizes and applies stop strings in this
process; the EngineCore runs its busy loop in another (core_proc.py) behind an MPClient."""

import asyncio
import time

from pagedserve.config import EngineConfig
from pagedserve.engine.admission import AdmissionControl, Deadlines, ServingLimits, with_queue_defaults
from pagedserve.engine.block_snapshot_wait import BlockSnapshotWait
from pagedserve.engine.core_proc import EngineCoreHandshake
from pagedserve.engine.dp_client import DPClient
from pagedserve.engine.frontend import Frontend
from pagedserve.engine.input_processor import EngineLimits, InputProcessor, PromptType
from pagedserve.engine.mp_client import MPClient
from pagedserve.engine.output_processor import OutputProcessor, RequestState
from pagedserve.engine.pooling_input import PoolingOptions
from pagedserve.engine.request_log import log_added, log_lost
from pagedserve.engine.request_options import RequestOptions, request_options
from pagedserve.engine.request_stream import RequestStream
from pagedserve.engine.sleep_control import SleepControl
from pagedserve.engine.stats_recorder import StatsRecorder
from pagedserve.engine.tokenizer import AnyTokenizer, load_tokenizer
from pagedserve.engine.watchdog import FRONTEND_GRACE_S, poll_interval_s, stall_message
from pagedserve.errors import CapacityError, EngineDeadError, RequestFailedError
from pagedserve.logger import init_logger
from pagedserve.metrics.loggers import StatLoggerBase
from pagedserve.metrics.stats import IterationStats
from pagedserve.protocol import BlockSnapshot, EngineCoreOutputs, EngineCoreRequest, LoRARequest
from pagedserve.sampling_params import SamplingParams
from pagedserve.utils.child_process import ChildProcess
from pagedserve.utils.light_tokenizer import LightTokenizer, TokenizerSnapshot

logger = init_logger(__name__)

_STOP_WAIT_S = 30.0  # stop(): the engine process's time to end on its own before it is terminated
_STOP_POLL_S = 0.1


class AsyncLLM:
    """Serves many concurrent `generate()` calls from one event loop, within `limits` (admission,
    token budgets, deadlines, the stall watchdog). Build it with `create()`. `tokenizer`: the tokenizer's
    snapshot when the settings process took one (config/frontend_config.py: the API server then reads it
    without transformers), else transformers loads it here."""

    def __init__(
        self,
        config: EngineConfig,
        stat_loggers: list[StatLoggerBase],
        log_requests: bool,
        log_stats_interval_s: float,
        limits: ServingLimits,
        tokenizer: TokenizerSnapshot | None = None,
        engine_process: ChildProcess | None = None,
    ) -> None:
        self.config = config
        self.tokenizer: AnyTokenizer = (
            load_tokenizer(config.model) if tokenizer is None else LightTokenizer(tokenizer)
        )
        self.input_processor = InputProcessor(
            config.model,
            self.tokenizer,
            scheduling_policy=config.scheduler.policy,
            lora=config.lora,
            reasoning=config.reasoning,
        )
        self.input_processor.structured_outputs.max_spec_bytes = limits.max_structured_output_bytes
        self.stats = StatsRecorder(stat_loggers, log_stats_interval_s)
        self.log_requests = log_requests
        # NOTE: --data-parallel-size N: N engine processes (replicas, here or on other nodes) behind this
        # one frontend.
        self.engine_core: MPClient | DPClient = (
            MPClient(config, limits.engine_stall_timeout, engine_process)
            if config.parallel.data_parallel_size == 1 and not config.parallel.remote_replicas
            else DPClient(config, limits.engine_stall_timeout, engine_process)
        )
        self.frontend = Frontend(
            self.input_processor,
            OutputProcessor(self.tokenizer),
            self.engine_core,
            config.scheduler.max_num_seqs,
            limits,
        )
        self.sleep_control = SleepControl(self.engine_core)
        self.block_snapshots = BlockSnapshotWait(self.engine_core)
        self.handshake: EngineCoreHandshake | None = None
        self.dead_error: EngineDeadError | None = None
        self.dead_event = asyncio.Event()  # set once the engine has died
        self._streams: dict[str, RequestStream] = {}  # the submitted requests whose stream is open
        self._tasks: list[asyncio.Task[None]] = []
        self._last_progress = time.monotonic()  # the engine's last output, or when work arrived

    @classmethod
    async def create(
        cls,
        config: EngineConfig,
        stat_loggers: list[StatLoggerBase],
        log_requests: bool = True,
        log_stats_interval_s: float = 10.0,
        limits: ServingLimits | None = None,
        tokenizer: TokenizerSnapshot | None = None,
        engine_process: ChildProcess | None = None,
    ) -> "AsyncLLM":
        """Start the engine process (in `engine_process` if given: one waiting for it, see
        config/frontend_config.py) and wait until it is ready. Raises ConfigError (bad settings) or
        EngineDeadError (failed to start); the process is gone either way."""
        try:
            engine = cls(
                config,
                stat_loggers,
                log_requests,
                log_stats_interval_s,
                limits or ServingLimits(),
                tokenizer,
                engine_process,
            )
        except BaseException:
            if engine_process is not None:
                engine_process.kill()
            raise
        await engine.start()
        return engine

    async def start(self) -> None:
        """Wait until the engine process (started by the constructor) is ready, then handle its outputs in
        this event loop: every later call must come from it. Raises as `create()`; the process is gone then."""
        config = self.config
        try:
            self.handshake = await self.engine_core.wait_until_ready()
            num_kv_blocks, block_size = self.handshake.num_blocks - 1, self.handshake.block_size
            self.input_processor.limits = EngineLimits(
                config.scheduler.max_num_seqs, num_kv_blocks, config.kv_layout
            )
            replicas = config.parallel.data_parallel_size
            self.admission.limits = with_queue_defaults(
                self.limits, config.scheduler.max_num_seqs * replicas, num_kv_blocks * replicas, block_size
            )
            logger.info(
                "Queue: at most %d requests and %d prompt tokens wait for the engine "
                "(--max-num-queued-requests, --max-num-queued-tokens; -1: no limit).",
                self.limits.max_num_queued_requests,
                self.limits.max_num_queued_tokens,
            )
        except BaseException:
            self.shutdown()
            raise
        self._tasks = [
            asyncio.create_task(self._run_output_handler()),
            asyncio.create_task(self.stats.run_logging()),
        ]
        if self.limits.engine_stall_timeout > 0:
            self._tasks.append(asyncio.create_task(self._run_stall_watchdog()))

    @property
    def admission(self) -> AdmissionControl:
        """The queue of requests not started yet, and its limits."""
        return self.frontend.admission

    @property
    def limits(self) -> ServingLimits:
        return self.frontend.admission.limits

    def get_tokenizer(self) -> AnyTokenizer:
        return self.tokenizer

    @property
    def errored(self) -> bool:
        return self.dead_error is not None or not self.engine_core.is_alive()

    def check_health(self) -> None:
        """Raises EngineDeadError if the engine process is gone."""
        if self.errored:
            raise self.death_error()

    def death_error(self) -> EngineDeadError:
        """Why the engine is dead (call once `errored`)."""
        return self.dead_error or self.engine_core.dead_error()

    @property
    def num_requests_in_flight(self) -> int:
        return len(self._streams)

    def process_inputs(
        self, request_id: str, prompt: PromptType, options: RequestOptions
    ) -> EngineCoreRequest:
        """Validate and tokenize without queuing anything (so a request of several prompts can be checked
        whole before any of it reaches the engine), within the token budgets. Thread-safe. Raises
        InvalidRequestError."""
        return self.frontend.process(request_id, prompt, options)[1]

    def process_pooling_inputs(
        self, request_id: str, prompt: PromptType, options: PoolingOptions
    ) -> EngineCoreRequest:
        """process_inputs() for the pooling runner (--runner pooling). Thread-safe; raises
        InvalidRequestError (for a generation model too, naming the runner to use)."""
        return self.frontend.process_pooling(request_id, prompt, options)[1]

    async def reset_prefix_cache(self) -> None:
        """Make the engine forget its cached KV blocks. Raises EngineDeadError."""
        self.check_health()
        self.engine_core.reset_prefix_cache()

    def submit(
        self, requests: list[EngineCoreRequest], timeout_s: float | None = None
    ) -> list[RequestStream]:
        """Queue what process_inputs() returned, all or none, and return each request's outputs. Raises
        CapacityError (503) at once when the queue limits would be exceeded, EngineDeadError if the engine
        is dead: call before a response starts, so a refusal is a status, not a stream. Past its deadline
        (`timeout_s`, --request-timeout) a request is aborted; its last output has finish_reason "abort".
        Closing a stream before its end aborts its request in the engine at once (its KV blocks are freed)."""
        self.check_health()
        self.sleep_control.before_submit()
        try:
            self.frontend.submit([(None, request) for request in requests])
        except CapacityError:
            self.record_rejected(len(requests))
            raise
        if self.frontend.output_processor.num_unfinished == len(requests):
            self._last_progress = time.monotonic()  # the stall clock starts with the work (only these)
        streams = []
        for request in requests:
            stream = RequestStream(self, request.request_id, Deadlines.start(self.limits, timeout_s))
            self._streams[request.request_id] = stream
            streams.append(stream)
            if self.log_requests:
                log_added(request)
        return streams

    def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams | RequestOptions,
        request_id: str,
        *,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        timeout_s: float | None = None,
    ) -> RequestStream:
        """process_inputs() and submit() for one prompt: its RequestOptions, or a SamplingParams with
        vLLM's keyword arguments. Raises as they do."""
        options = request_options(sampling_params, priority=priority, lora_request=lora_request)
        return self.submit([self.process_inputs(request_id, prompt, options)], timeout_s)[0]

    def release(self, request_id: str) -> None:
        """The request's stream ended (its last output read, or the engine died)."""
        self._streams.pop(request_id, None)
        self.admission.dequeue(request_id, started=False)

    def request_state(self, request_id: str) -> RequestState | None:
        return self.frontend.output_processor.get(request_id)

    def abort(self, request_id: str, reason: str | None = None) -> None:
        """End a request wherever it is; a no-op for one that already ended. A `reason` is logged."""
        self.release(request_id)
        stats = IterationStats()
        if not self.frontend.abort(request_id, stats):
            return
        self.stats.record(None, stats)
        if reason is not None:
            logger.info("Aborted request %s: %s.", request_id, reason)
        elif self.log_requests:
            logger.info("Aborted request %s.", request_id)

    def end(self, request_id: str) -> None:
        """Abort a request for its caller: a reader of its stream gets its final output next (finish_reason
        "abort") rather than waiting for one that never comes."""
        stream = self._streams.get(request_id)
        if stream is None:
            self.abort(request_id)
        else:
            stream.abort()

    async def abort_all(self, error: Exception) -> int:
        """Fail every request in flight with `error` (its handler raises it) and abort it in the engine.
        Returns how many there were."""
        streams = list(self._streams.values())
        for stream in streams:
            self.abort(stream.request_id, str(error))
            stream.queue.put_nowait(error)
        return len(streams)

    async def sleep(self, level: int) -> None:
        """Free the model's weights and KV cache until wake_up() (or a request, with --wake-on-request).
        Raises InvalidRequestError (a bad level, requests in flight), EngineDeadError."""
        self.check_health()
        await self.sleep_control.sleep(level, self.num_requests_in_flight)

    async def wake_up(self) -> None:
        """Load the weights and allocate the KV cache again. Raises EngineDeadError."""
        self.check_health()
        await self.sleep_control.wake_up()

    async def get_block_snapshot(self) -> BlockSnapshot | None:
        """The KV block pool's state, asked of the engine (answered between two steps); None if the
        engine did not answer within a few seconds. Raises EngineDeadError."""
        self.check_health()
        return await self.block_snapshots.get()

    async def _run_output_handler(self) -> None:
        """Route the engine's outputs to the requests' queues, until the engine dies."""
        try:
            while True:
                core_outputs = await self.engine_core.get_output()
                self._last_progress = time.monotonic()
                self._process_outputs(core_outputs)
        except EngineDeadError as exc:
            self._on_engine_dead(exc)
        except Exception as exc:  # a bug here would hang every request: fail them all loudly instead
            logger.exception("The output handler failed.")
            self._on_engine_dead(EngineDeadError(f"The engine's output handler failed: {exc!r}"))

    def _process_outputs(self, core_outputs: EngineCoreOutputs) -> None:
        stats = IterationStats()
        self.block_snapshots.answered(core_outputs.block_snapshot)
        if core_outputs.sleep_level is not None:
            self.sleep_control.answered(core_outputs.sleep_level)
        for output in self.frontend.process_outputs(core_outputs, stats):
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.queue.put_nowait(output if output.error is None else RequestFailedError(output.error))
        self.stats.record(core_outputs.scheduler_stats, stats, core_outputs.engine_index)

    def record_rejected(self, num_requests: int) -> None:
        """Count requests refused for capacity (a full queue, the queue time)."""
        self.stats.record(None, IterationStats(num_rejected_requests=num_requests))

    async def _run_stall_watchdog(self) -> None:
        """The API server's side of --engine-stall-timeout: an engine process that sends nothing while
        requests are in flight (frozen, so its own watchdog cannot fire) is killed and declared dead."""
        timeout_s = self.limits.engine_stall_timeout + FRONTEND_GRACE_S
        while self.dead_error is None:
            await asyncio.sleep(poll_interval_s(timeout_s))
            silent_s = time.monotonic() - self._last_progress
            # NOTE: the engine's unfinished requests, not _streams: a slow reader's finished stream is no work.
            unfinished = self.frontend.output_processor.num_unfinished
            if unfinished and silent_s > timeout_s:
                logger.error(
                    "The engine process sent nothing for %.0f s while %d request(s) were in flight: it "
                    "is unresponsive (--engine-stall-timeout %g) and is killed.",
                    silent_s,
                    unfinished,
                    self.limits.engine_stall_timeout,
                )
                self.engine_core.kill()
                self._on_engine_dead(EngineDeadError(stall_message(self.limits.engine_stall_timeout)))

    def _on_engine_dead(self, error: EngineDeadError) -> None:
        """Fail every request in flight (none may hang) and say in the log what was lost. Idempotent."""
        if self.dead_error is not None:
            return
        self.dead_error = error
        log_lost(error, self.frontend.output_processor.fail_all(), self.stats.scheduler_stats.combined())
        for stream in self._streams.values():
            stream.queue.put_nowait(error)
        self._streams.clear()
        self.sleep_control.engine_died(error)
        self.dead_event.set()

    async def stop(self) -> None:
        """shutdown() once the engine process has ended by itself (up to a limit), so that the event loop
        never waits for a process to exit (the model pool unloads models while it serves others)."""
        for task in self._tasks:
            task.cancel()
        if isinstance(self.engine_core, MPClient):
            self.engine_core.request_shutdown()
            deadline = time.monotonic() + _STOP_WAIT_S
            while self.engine_core.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(_STOP_POLL_S)
        self.shutdown()  # NOTE: terminates the process if it has not ended

    def shutdown(self) -> None:
        """Stop the background tasks and the engine process."""
        for task in self._tasks:
            task.cancel()
        self.engine_core.shutdown()
