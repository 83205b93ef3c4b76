"""LLMEngine: the in-process engine behind `LLM`, with the public add_request / step / abort_request /
has_unfinished_requests API. Tokenizes and detokenizes around an EngineCore in the same process
(`InprocClient`), through the same `Frontend` as the server."""

from typing import TYPE_CHECKING

from pagedserve.config import EngineArgs
from pagedserve.engine.admission import ServingLimits
from pagedserve.engine.core import EngineCore
from pagedserve.engine.core_client import InprocClient
from pagedserve.engine.dp_client import SyncDPClient
from pagedserve.engine.frontend import Frontend
from pagedserve.engine.input_processor import EngineLimits, InputProcessor, PromptType
from pagedserve.engine.output_processor import OutputProcessor
from pagedserve.engine.pooling_input import PoolingOptions
from pagedserve.engine.request_options import RequestOptions, request_options
from pagedserve.engine.tokenizer import load_tokenizer
from pagedserve.errors import ConfigError
from pagedserve.outputs import RequestOutput
from pagedserve.protocol import LoRARequest
from pagedserve.sampling_params import BeamSearchParams, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class LLMEngine:
    """`limits`: the queue limits and token budgets (none by default: an offline batch may queue every
    prompt at once)."""

    def __init__(self, engine_args: EngineArgs, limits: ServingLimits | None = None) -> None:
        self.config = engine_args.create_engine_config()
        if self.config.parallel.headless:
            raise ConfigError(
                "headless=True runs replicas for a server's head: use `pagedserve serve --headless`."
            )
        self.tokenizer = load_tokenizer(self.config.model)
        # NOTE: --data-parallel-size N: the replicas are engine processes; step() waits for any of them.
        self.client: InprocClient | SyncDPClient
        if self.config.parallel.data_parallel_size == 1 and not self.config.parallel.remote_replicas:
            self.client = InprocClient(EngineCore(self.config, log_stats=False))
            num_blocks = self.client.engine_core.kv_cache_config.num_blocks
        else:
            self.client = SyncDPClient(self.config)
            num_blocks = self.client.handshake.num_blocks
        max_num_seqs = self.config.scheduler.max_num_seqs
        input_processor = InputProcessor(
            self.config.model,
            self.tokenizer,
            EngineLimits(max_num_seqs, num_blocks - 1, self.config.kv_layout),
            self.config.scheduler.policy,
            self.config.lora,
            self.config.reasoning,
        )
        self.frontend = Frontend(
            input_processor,
            OutputProcessor(self.tokenizer, measures=False),
            self.client,
            max_num_seqs,
            limits or ServingLimits(),
        )

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        return cls(engine_args)

    @property
    def engine_core(self) -> EngineCore:
        """The engine core, in this process (not with --data-parallel-size > 1: the replicas' are not)."""
        if not isinstance(self.client, InprocClient):
            raise ConfigError(
                "This needs the engine in this process; with data_parallel_size > 1 the replicas run in "
                "processes of their own (serve them, and use the server's routes)."
            )
        return self.client.engine_core

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | RequestOptions,
        arrival_time: float | None = None,
        beam_search: BeamSearchParams | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Validate and queue a request: `params` its RequestOptions, or a SamplingParams with vLLM's
        keyword arguments (a beam search with `beam_search`: its `params.n` best beams come back;
        `priority` under --scheduling-policy priority). Several threads may add at once (not while step()
        runs). Raises InvalidRequestError, or CapacityError past the queue limits; nothing refused is
        queued."""
        options = request_options(
            params,
            beam_search=beam_search,
            priority=priority,
            lora_request=lora_request,
            arrival_time=arrival_time,
        )
        self.frontend.submit([self.frontend.process(request_id, prompt, options)])

    def add_pooling_requests(self, requests: list[tuple[str, PromptType, PoolingOptions]]) -> None:
        """Validate every (request id, prompt, options) of a pooling batch (--runner pooling), then queue
        all or none (raises as add_request does), longest first: each step then batches prompts of
        similar lengths, little padding in the attention, as sentence-transformers sorts its batches."""
        processed = [self.frontend.process_pooling(*request) for request in requests]
        processed.sort(key=lambda item: -len(item[1].prompt_token_ids))
        self.frontend.submit(processed)

    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the requests that progressed (with `finished` set on the last)."""
        return self.frontend.process_outputs(self.client.step())

    def abort_request(self, request_ids: str | list[str]) -> None:
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            self.frontend.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        """Requests not finished, or pipeline batches still in flight (only of aborted requests then:
        stepping them to their end gives those requests' blocks back)."""
        client = self.client
        in_flight = isinstance(client, InprocClient) and bool(client.engine_core.batch_queue)
        return self.frontend.output_processor.num_unfinished > 0 or in_flight

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block (e.g. after changing weights, or between benchmark runs)."""
        return self.client.reset_prefix_cache()

    def get_tokenizer(self) -> "PreTrainedTokenizerBase":
        return self.tokenizer
