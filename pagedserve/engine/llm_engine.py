"""LLMEngine: the in-process engine behind `LLM`, with the public add_request / step / abort_request /
has_unfinished_requests API. Tokenizes and detokenizes around an EngineCore in the same process."""

import time
from typing import Any

from pagedserve.config import EngineArgs
from pagedserve.engine.core import EngineCore
from pagedserve.engine.input_processor import EngineLimits, InputProcessor, PromptType
from pagedserve.engine.output_processor import OutputProcessor
from pagedserve.engine.tokenizer import load_tokenizer
from pagedserve.errors import InvalidRequestError
from pagedserve.outputs import RequestOutput
from pagedserve.sampling_params import BeamSearchParams, SamplingParams


class LLMEngine:
    def __init__(self, engine_args: EngineArgs) -> None:
        self.config = engine_args.create_engine_config()
        self.tokenizer = load_tokenizer(self.config.model)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.engine_core = EngineCore(self.config)
        kv = self.engine_core.kv_cache_config
        self.input_processor = InputProcessor(
            self.config.model,
            self.tokenizer,
            EngineLimits(self.config.scheduler.max_num_seqs, kv.num_blocks - 1, kv.block_size),
        )

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        return cls(engine_args)

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        beam_search: BeamSearchParams | None = None,
    ) -> None:
        """Validate and queue a request (a beam search with `beam_search`: its `params.n` best beams
        come back). Raises InvalidRequestError; nothing invalid is queued."""
        if request_id in self.output_processor:
            raise InvalidRequestError(f"Request id {request_id!r} is already in use.", param="request_id")
        text, request = self.input_processor.process(
            request_id, prompt, params, arrival_time or time.time(), beam_search
        )
        for child in self.output_processor.register(request_id, text, request):
            self.engine_core.add_request(child)

    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the requests that progressed (with `finished` set on the last)."""
        outputs = self.engine_core.step()
        request_outputs, to_abort = self.output_processor.process_outputs(outputs)
        if to_abort:
            self.engine_core.abort_requests(to_abort)
        return request_outputs

    def abort_request(self, request_ids: str | list[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else request_ids
        children = [cid for rid in ids for cid in self.output_processor.abort_request(rid)]
        self.engine_core.abort_requests(children)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.num_unfinished > 0

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block (e.g. after changing weights, or between benchmark runs)."""
        return self.engine_core.reset_prefix_cache()

    def get_tokenizer(self) -> Any:
        return self.tokenizer
