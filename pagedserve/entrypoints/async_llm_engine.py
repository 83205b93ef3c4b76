"""vLLM's `AsyncLLMEngine` (its v1 `AsyncLLM`) for scripts: `from_engine_args()` is a plain call that starts
the engine process, which loads the model meanwhile; `generate()` is an async generator of RequestOutputs.
The first call made in an event loop waits until the engine is ready and ties it to that loop."""

import asyncio
from collections.abc import AsyncIterator, Iterable

from pagedserve.config import EngineArgs
from pagedserve.engine.admission import ServingLimits
from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.engine.input_processor import PromptType
from pagedserve.engine.tokenizer import AnyTokenizer
from pagedserve.lora.request import LoRARequest
from pagedserve.metrics.loggers import StatLoggerBase
from pagedserve.outputs import RequestOutput
from pagedserve.sampling_params import SamplingParams

AsyncEngineArgs = EngineArgs  # vLLM's name for the same arguments


class AsyncLLMEngine:
    def __init__(self, engine: AsyncLLM) -> None:
        self.engine = engine
        self._ready: asyncio.Future[None] | None = None

    @classmethod
    def from_engine_args(
        cls, engine_args: EngineArgs, stat_loggers: list[StatLoggerBase] | None = None
    ) -> "AsyncLLMEngine":
        """Bad settings raise here (ConfigError); a model that fails to load, on the first call."""
        config = engine_args.create_engine_config()
        # NOTE: no queue limits: a script's burst of requests waits whole, as vLLM's and LLM's do.
        unbounded = ServingLimits(max_num_queued_requests=-1, max_num_queued_tokens=-1)
        return cls(AsyncLLM(config, stat_loggers or [], False, 10.0, unbounded))

    async def _started(self) -> AsyncLLM:
        if self._ready is None:  # NOTE: one start, however many calls wait for it
            self._ready = asyncio.ensure_future(self.engine.start())
        await asyncio.shield(self._ready)
        return self.engine

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs (per `sampling_params.output_kind`: cumulative by default), the last one
        `finished`. Leaving the loop early aborts the request."""
        engine = await self._started()
        stream = engine.generate(
            prompt, sampling_params, request_id, lora_request=lora_request, priority=priority
        )
        try:
            async for output in stream:
                yield output
        finally:
            await stream.aclose()

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """End the requests; a generate() loop over one gets its final output (finish_reason "abort")."""
        engine = await self._started()
        for one in [request_id] if isinstance(request_id, str) else request_id:
            engine.end(one)

    async def get_tokenizer(self) -> AnyTokenizer:
        return self.engine.get_tokenizer()

    async def check_health(self) -> None:
        """Raises EngineDeadError once the engine has died."""
        (await self._started()).check_health()

    @property
    def errored(self) -> bool:
        return self.engine.errored

    def shutdown(self) -> None:
        self.engine.shutdown()
