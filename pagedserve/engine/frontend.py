"""The one way a request enters the engine, and its outputs' way back, shared by `LLMEngine` (offline) and
`AsyncLLM` (server): process (validate, tokenize, token budgets) → submit (admit, register, split into
its samples, send through the EngineCoreClient) → outputs (leave the queue when started, detokenize,
stop strings) → finish or abort."""

import threading

from pagedserve.engine.admission import (
    AdmissionControl,
    ServingLimits,
    apply_token_budgets,
    check_num_samples,
)
from pagedserve.engine.core_client import EngineCoreClient
from pagedserve.engine.input_processor import InputProcessor, PromptType
from pagedserve.engine.output_processor import OutputProcessor
from pagedserve.engine.pooling_input import POOLING_SAMPLING_PARAMS, PoolingInputProcessor, PoolingOptions
from pagedserve.engine.request_options import RequestOptions
from pagedserve.errors import InvalidRequestError
from pagedserve.metrics.stats import IterationStats
from pagedserve.outputs import RequestOutput
from pagedserve.protocol import EngineCoreOutputs, EngineCoreRequest

# A validated request and its prompt's text (None when it came as token ids, or is not wanted back).
ProcessedRequest = tuple[str | None, EngineCoreRequest]


class Frontend:
    """Requests in flight between a caller and an EngineCoreClient. `submit` may be called from several
    threads; everything else from the one thread that drives the engine (or the event loop)."""

    def __init__(
        self,
        input_processor: InputProcessor,
        output_processor: OutputProcessor,
        client: EngineCoreClient,
        max_num_seqs: int,
        limits: ServingLimits,
    ) -> None:
        self.input_processor = input_processor
        self.output_processor = output_processor
        self.client = client
        self.max_num_seqs = max_num_seqs
        self.admission = AdmissionControl(limits)
        pooling = input_processor.model_config.pooling
        # --runner pooling: pooling requests only (generation ones are refused by `process`).
        self.pooling_inputs = None if pooling is None else PoolingInputProcessor(input_processor, pooling)
        # NOTE: admission and enqueue happen under this lock, in one call: two concurrent submits can never
        # both pass the check and together exceed the queue limits.
        self._submit_lock = threading.Lock()

    def process(self, request_id: str, prompt: PromptType, options: RequestOptions) -> ProcessedRequest:
        """Validate and tokenize, within the token budgets; nothing is queued (a request of several
        prompts is checked whole first). Thread-safe. Raises InvalidRequestError."""
        if self.pooling_inputs is not None:
            raise InvalidRequestError(
                "This model is served by the pooling runner (--runner pooling): it computes embeddings and "
                "scores, not text. Use /v1/embeddings, /pooling, /classify, /score or /rerank (LLM.embed, "
                "LLM.classify, LLM.score), or serve it with --runner generate.",
                param="model",
            )
        check_num_samples(options.sampling_params, self.max_num_seqs)
        text, request = self.input_processor.process(request_id, prompt, options)
        return text, apply_token_budgets(request, options.sampling_params, self.admission.limits)

    def process_pooling(
        self, request_id: str, prompt: PromptType, options: PoolingOptions, arrival_time: float | None = None
    ) -> ProcessedRequest:
        """`process` for the pooling runner: validate and tokenize, within the input token budget."""
        if self.pooling_inputs is None:
            raise InvalidRequestError(
                "This model generates text: embeddings, classification and scores need a pooling model "
                "served with --runner pooling (an encoder such as BERT, or --convert embed).",
                param="model",
            )
        text, request = self.pooling_inputs.process(request_id, prompt, options, arrival_time)
        return text, apply_token_budgets(request, POOLING_SAMPLING_PARAMS, self.admission.limits)

    def submit(self, requests: list[ProcessedRequest]) -> None:
        """Admit all of `requests` or none (InvalidRequestError for a request id in use, CapacityError when
        the queue limits would be exceeded, EngineDeadError when the engine is gone), then send each as
        its samples (one group) or its beam search to the engine core."""
        ids = [request.request_id for _, request in requests]
        with self._submit_lock:
            if not self.client.is_alive():
                raise self.client.dead_error()
            in_use = next(
                (rid for i, rid in enumerate(ids) if rid in self.output_processor or rid in ids[:i]), None
            )
            if in_use is not None:
                raise InvalidRequestError(f"Request id {in_use!r} is already in use.", param="request_id")
            self.admission.admit(
                [(request.request_id, len(request.prompt_token_ids)) for _, request in requests]
            )
            children: list[EngineCoreRequest] = []
            try:
                for text, request in requests:
                    children += self.output_processor.register(request.request_id, text, request)
                self.client.add_requests(children)
            except BaseException:
                # NOTE: nothing of a refused submit stays registered, queued, or in the engine (an
                # in-process engine may have taken the first samples before one failed).
                for request_id in ids:
                    self.output_processor.abort_request(request_id)
                    self.admission.dequeue(request_id, started=False)
                if children and self.client.is_alive():
                    self.client.abort_requests([child.request_id for child in children])
                raise

    def process_outputs(
        self, core_outputs: EngineCoreOutputs, stats: IterationStats | None = None
    ) -> list[RequestOutput]:
        """The outputs due (per each request's output_kind); requests the engine started or could not
        take (`error` set) leave the queue, and samples a stop string ended are aborted in the engine."""
        # NOTE: before the outputs: a request that ends in its first step is forgotten by them.
        for child_id in core_outputs.scheduled_request_ids:
            parent = self.output_processor.parent_of(child_id)
            if parent is not None:
                self.admission.dequeue(parent.request_id, started=True)
        request_outputs, to_abort = self.output_processor.process_outputs(core_outputs, stats)
        for output in request_outputs:
            if output.error is not None:  # the engine could not take it: it never starts
                self.admission.dequeue(output.request_id, started=False)
        if to_abort and self.client.is_alive():
            self.client.abort_requests(to_abort)
        return request_outputs

    def abort(self, request_id: str, stats: IterationStats | None = None) -> bool:
        """End a request wherever it is; False if it had already ended (a no-op)."""
        self.admission.dequeue(request_id, started=False)
        child_ids = self.output_processor.abort_request(request_id, stats)
        if child_ids and self.client.is_alive():
            self.client.abort_requests(child_ids)
        return bool(child_ids)
