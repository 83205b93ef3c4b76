"""The engine core's view of one request."""

import copy
import enum

from pagedserve.core.hashing import BlockHash
from pagedserve.core.thinking import ThinkingState
from pagedserve.protocol import EngineCoreRequest, FinishReason
from pagedserve.sampling_params import SamplingParams
from pagedserve.structured_output.matcher import RequestGrammar


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    SWAPPED = enum.auto()  # preempted with its KV copied to host memory
    FINISHED = enum.auto()


class Request:
    """Token state of one request. `num_computed_tokens` counts tokens whose K/V are in the cache;
    the tokens in [num_computed_tokens, num_tokens) are still to be computed. Requests with the same
    `group_id` (the samples of one prompt, the beams of one beam search) share KV blocks."""

    # NOTE: slots, not an instance dict: the scheduler reads these for every request every step, and
    # CPython 3.11 keeps an instance's attributes in a shared-key dict only up to 30 of them (past that,
    # each request got a dict of its own and a batch-64 step's host work took 7% longer).
    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "sampling_params",
        "eos_token_id",
        "arrival_time",
        "priority",
        "max_tokens",
        "all_token_ids",
        "num_reported",
        "final_only",
        "num_tokens_sent",
        "num_computed_tokens",
        "num_cached_tokens",
        "num_preemptions",
        "num_yields",
        "status",
        "finish_reason",
        "stop_reason",
        "cache_salt",
        "lora_request",
        "group_id",
        "beam_search",
        "pooling_params",
        "images",
        "block_hashes",
        "grammar",
        "thinking",
        "spec_token_ids",
        "num_spec_tokens",
        "num_prompt_logprobs_reported",
    )

    def __init__(self, request: EngineCoreRequest) -> None:
        self.request_id = request.request_id
        self.prompt_token_ids = request.prompt_token_ids
        self.sampling_params: SamplingParams = request.sampling_params
        self.eos_token_id = request.eos_token_id
        self.arrival_time = request.arrival_time
        self.priority = request.priority
        assert request.sampling_params.max_tokens is not None, "max_tokens is resolved by the frontend"
        self.max_tokens: int = request.sampling_params.max_tokens
        self.all_token_ids: list[int] = list(request.prompt_token_ids)
        # The tokens before this one were sent to the frontend (every step, or only the first and at the
        # end with `final_only`).
        self.num_reported = len(self.all_token_ids)
        self.final_only = request.final_only
        # How many of its tokens the workers' copy holds (None: the workers do not hold it: new, preempted).
        self.num_tokens_sent: int | None = None
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # its prefix-cache hit when first admitted (-1: not admitted yet)
        self.num_preemptions = 0
        self.num_yields = 0  # preemptions for a more urgent waiting request (bounded: urgent_preemption.py)
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.cache_salt = request.cache_salt
        self.lora_request = request.lora_request  # --enable-lora: its adapter (None: the base model)
        self.group_id = request.group_id
        self.beam_search = request.beam_search
        self.pooling_params = request.pooling_params  # --runner pooling: pooled, never sampled
        self.images = request.images or []  # an image model's prompt images (their placeholder tokens)
        self.block_hashes: list[BlockHash] = []  # chained hashes of the first full blocks (prefix cache)
        self.grammar: RequestGrammar | None = None  # set by the scheduler for a structured_outputs request
        self.thinking: ThinkingState | None = None  # set by the scheduler with --reasoning-parser
        self.spec_token_ids: list[int] = []  # draft tokens to verify next step (speculative decoding)
        self.num_spec_tokens = 2**31  # the most drafts it gets next step (spec_decode.adapt_num_spec_tokens)
        # Prompt positions whose logprobs (prompt_logprobs) were reported: a request recomputed after a
        # preemption computes them again, and they must not be reported twice.
        self.num_prompt_logprobs_reported = 0

    @property
    def lora_key(self) -> bytes:
        """Its adapter's identity (id and files' digest); empty for the base model."""
        return b"" if self.lora_request is None else self.lora_request.identity

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[len(self.prompt_token_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def fork(self, request_id: str) -> "Request":
        """A copy under a new id, with its own token list (a new beam): the same tokens and computed
        count; the caller shares the KV blocks."""
        child = copy.copy(self)
        child.request_id = request_id
        child.all_token_ids = list(self.all_token_ids)
        child.block_hashes = list(self.block_hashes)
        child.spec_token_ids = []
        child.num_preemptions = 0
        child.num_tokens_sent = None  # new to the workers
        return child

    def append_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)

    def check_stop(self, max_model_len: int, grammar_complete: bool = False) -> bool:
        """Set the finish reason if the last token ends the request. Stop *strings* are checked by
        the frontend, which sees text; here only token-level conditions (and a completed grammar)."""
        params, tokens = self.sampling_params, self.all_token_ids
        # NOTE: counts read once (not through the properties): this runs per request per step.
        num_tokens = len(tokens)
        num_output_tokens = num_tokens - len(self.prompt_token_ids)
        if grammar_complete:
            # NOTE: a grammar that dead-ended completed nothing: finish_reason "error", stop_reason why.
            failure = self.grammar.failure if self.grammar is not None else None
            self.finish_reason = FinishReason.STOP if failure is None else FinishReason.ERROR
            self.stop_reason = failure
        elif num_output_tokens >= params.min_tokens:
            last = tokens[-1]
            if last == self.eos_token_id and not params.ignore_eos:
                self.finish_reason = FinishReason.STOP
            elif params.stop_token_ids and last in params.stop_token_ids:
                self.finish_reason, self.stop_reason = FinishReason.STOP, last
        if self.finish_reason is None and (
            num_output_tokens >= self.max_tokens or num_tokens >= max_model_len
        ):
            self.finish_reason = FinishReason.LENGTH
        return self.finish_reason is not None
