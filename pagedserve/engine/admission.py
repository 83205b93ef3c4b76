"""What the server lets in, and for how long: a bounded queue (503 at once, never an unbounded wait),
per-request token budgets (400 with the numbers), and deadlines. All of it runs in the frontend
(AsyncLLM), before or around the engine core, which never sees a request it should not have taken.

The queue is the requests accepted but not yet scheduled by the engine: a request leaves it when its
first step starts (or when it ends). Preempted requests re-queued inside the engine do not count again:
the limits bound what arrives, and KV-aware admission keeps preemptions rare.
"""

import time
from collections import deque
from dataclasses import dataclass, replace

import msgspec

from pagedserve.config.cli import config_field
from pagedserve.errors import CapacityError, ConfigError, InvalidRequestError
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import SamplingParams
from pagedserve.structured_output.grammar import DEFAULT_MAX_SPEC_BYTES

UNBOUNDED = -1  # a queue limit's value for "no limit"
_QUEUE_LIMITS = ("max_num_queued_requests", "max_num_queued_tokens")
_RATE_WINDOW_S = 10.0  # starts counted for the Retry-After estimate
_MAX_RETRY_AFTER_S = 60


@dataclass(frozen=True)
class ServingLimits:
    """The server's admission, budget and watchdog settings (flags generated from the fields).
    Raises ConfigError naming the flag when a value is out of range."""

    max_num_queued_requests: int | None = config_field(
        None,
        "Requests that may wait for the engine at once; more get 503 with Retry-After at once. "
        "Default: twice what the engine runs at once (the smaller of --max-num-seqs and the KV cache's "
        "blocks); -1: no limit.",
    )
    max_num_queued_tokens: int | None = config_field(
        None,
        "Prompt tokens that may wait for the engine at once; more get 503 with Retry-After at once. "
        "Default: twice the KV cache's capacity in tokens; -1: no limit.",
    )
    max_queue_time: float | None = config_field(
        None,
        "Seconds a request may wait before the engine starts it; then it ends with a 503 timeout "
        "error. Default: no limit.",
    )
    request_timeout: float | None = config_field(
        None,
        "Seconds a request may run in all (a request's `timeout` field may ask for less); then it is "
        "aborted and returns what it has, finish_reason 'abort'. Default: no limit.",
    )
    max_input_tokens: int | None = config_field(
        None,
        "Most prompt tokens per request (after truncate_prompt_tokens); longer prompts get 400. "
        "Default: the context length.",
    )
    max_output_tokens: int | None = config_field(
        None,
        "Most tokens one request may generate; a larger max_tokens gets 400, and requests without "
        "max_tokens get the rest of the context capped at this. Default: the context length.",
    )
    max_structured_output_bytes: int = config_field(
        DEFAULT_MAX_SPEC_BYTES,
        "Largest JSON schema, regex, choice list or grammar a request may constrain its "
        "output with; larger ones get 413 (compiles are also bounded by llguidance's fuel limits).",
    )
    engine_stall_timeout: float = config_field(
        300.0,
        "Seconds the engine may go without finishing a step while it has work; then it is declared "
        "dead (the state is logged, requests fail, /health answers 503, the server exits 1). "
        "0 disables the watchdog.",
    )

    def __post_init__(self) -> None:
        for name in _QUEUE_LIMITS:
            value = getattr(self, name)
            if value is not None and value <= 0 and value != UNBOUNDED:
                raise ConfigError(
                    f"{name}={value} must be positive, or {UNBOUNDED} for no limit "
                    f"(--{name.replace('_', '-')}); leave it out for the default."
                )
        for name in (
            "max_structured_output_bytes",
            "max_input_tokens",
            "max_output_tokens",
            "max_queue_time",
            "request_timeout",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(
                    f"{name}={value} must be positive (--{name.replace('_', '-')}); leave it "
                    "out for no limit."
                )
        if self.engine_stall_timeout < 0:
            raise ConfigError(
                f"engine_stall_timeout={self.engine_stall_timeout} must not be negative "
                "(--engine-stall-timeout; 0 disables the watchdog)."
            )


def with_queue_defaults(
    limits: ServingLimits, max_num_seqs: int, num_kv_blocks: int, block_size: int
) -> ServingLimits:
    """`limits` with the queue limits left out set to their defaults, so that the queue is bounded with
    default flags (never OOM, never hang): twice what the engine holds at once, in requests (each
    running request holds a KV block at least) and in tokens. Explicit values (-1 included) stay."""
    defaults = {
        "max_num_queued_requests": 2 * min(max_num_seqs, num_kv_blocks),
        "max_num_queued_tokens": 2 * num_kv_blocks * block_size,
    }
    return replace(
        limits, **{name: value for name, value in defaults.items() if getattr(limits, name) is None}
    )


def _bound(value: int | None) -> int | None:
    """A queue limit, None when there is none."""
    return None if value is None or value == UNBOUNDED else value


class AdmissionControl:
    """Counts the queued requests and their prompt tokens; refuses what would exceed the limits."""

    def __init__(self, limits: ServingLimits) -> None:
        self.limits = limits
        self.queued: dict[str, int] = {}  # request id -> prompt tokens
        self.num_queued_tokens = 0
        self._starts: deque[float] = deque()  # when recent requests left the queue for the engine

    def check(self, num_requests: int, num_tokens: int) -> None:
        """Raises CapacityError (503) if `num_requests` more requests of `num_tokens` prompt tokens in
        all would exceed a queue limit now, InvalidRequestError (400) if they never could."""
        max_requests = _bound(self.limits.max_num_queued_requests)
        max_tokens = _bound(self.limits.max_num_queued_tokens)
        if max_tokens is not None and num_tokens > max_tokens:
            raise InvalidRequestError(
                f"The request's {num_tokens} prompt tokens are more than may ever wait at once, "
                f"{max_tokens} (--max-num-queued-tokens); shorten the prompt or send "
                "fewer prompts in one request.",
                param="prompt",
            )
        if max_requests is not None and num_requests > max_requests:
            raise InvalidRequestError(
                f"The request's {num_requests} prompts are more than may ever wait at once, {max_requests} "
                "(--max-num-queued-requests); send fewer prompts in one request.",
                param="prompt",
            )
        if max_requests is not None and len(self.queued) + num_requests > max_requests:
            raise CapacityError(
                f"The server is at capacity: {len(self.queued)} requests are waiting for the engine, the "
                f"limit is {max_requests} (raise --max-num-queued-requests to queue more, -1 for no limit; "
                f"vLLM queues without a limit). Retry after "
                f"{self.retry_after_s():.0f} s.",
                self.retry_after_s(),
            )
        if max_tokens is not None and self.num_queued_tokens + num_tokens > max_tokens:
            raise CapacityError(
                f"The server is at capacity: {self.num_queued_tokens} prompt tokens are waiting for the "
                f"engine and this request adds {num_tokens}, over the limit of "
                f"{max_tokens} (raise --max-num-queued-tokens to queue more, -1 for no limit; vLLM queues "
                f"without a limit). Retry after "
                f"{self.retry_after_s():.0f} s.",
                self.retry_after_s(),
            )

    def admit(self, requests: list[tuple[str, int]]) -> None:
        """Count all of `requests` (request id, prompt tokens) in, or none of them and raise as check()
        does. The caller makes it atomic (Frontend.submit's lock)."""
        self.check(len(requests), sum(num_tokens for _, num_tokens in requests))
        for request_id, num_tokens in requests:
            self.queued[request_id] = num_tokens
            self.num_queued_tokens += num_tokens

    def dequeue(self, request_id: str, started: bool) -> None:
        """The request left the queue: `started` by the engine, or ended. Idempotent."""
        num_tokens = self.queued.pop(request_id, None)
        if num_tokens is None:
            return
        self.num_queued_tokens -= num_tokens
        if started:
            now = time.monotonic()
            self._starts.append(now)
            while self._starts and self._starts[0] < now - _RATE_WINDOW_S:
                self._starts.popleft()

    def retry_after_s(self) -> float:
        """When a place should be free: the queue's length over the recent rate of starts (1 s at
        least, 60 at most)."""
        now = time.monotonic()
        recent = sum(1 for t in self._starts if t >= now - _RATE_WINDOW_S)
        if not recent:
            return float(_MAX_RETRY_AFTER_S if self.queued else 1)
        return float(min(_MAX_RETRY_AFTER_S, max(1, round(len(self.queued) * _RATE_WINDOW_S / recent))))


def check_num_samples(params: SamplingParams, max_num_seqs: int) -> None:
    """Each of a request's n (best_of) samples is a request in the engine: one request may not ask for
    more than the engine runs at once. Raises InvalidRequestError."""
    if params.num_samples > max_num_seqs:
        raise InvalidRequestError(
            f"{params.num_samples} samples (n / best_of) are more than the engine runs at "
            f"once, {max_num_seqs} (--max-num-seqs); lower n or best_of.",
            param="n",
        )


def apply_token_budgets(
    request: EngineCoreRequest, asked: SamplingParams, limits: ServingLimits
) -> EngineCoreRequest:
    """Check `request` (validated, max_tokens resolved) against --max-input-tokens and
    --max-output-tokens; `asked` are the parameters as the client sent them. A request that did not set
    max_tokens gets the rest of the context capped at --max-output-tokens. Raises InvalidRequestError."""
    num_prompt = len(request.prompt_token_ids)
    if limits.max_input_tokens is not None and num_prompt > limits.max_input_tokens:
        raise InvalidRequestError(
            f"The prompt has {num_prompt} tokens, more than this server's limit of {limits.max_input_tokens} "
            f"input tokens (--max-input-tokens). Shorten the prompt, or set truncate_prompt_tokens to at "
            f"most {limits.max_input_tokens} to keep only its last tokens.",
            param="prompt",
        )
    limit = limits.max_output_tokens
    if limit is None:
        return request
    if asked.max_tokens is not None and asked.max_tokens > limit:
        raise InvalidRequestError(
            f"max_tokens={asked.max_tokens} is more than this server's limit of {limit} "
            "output tokens (--max-output-tokens); lower max_tokens.",
            param="max_tokens",
        )
    params = request.sampling_params
    if params.max_tokens is not None and params.max_tokens > limit:
        # NOTE: a min_tokens above the cap fails SamplingParams' own check (400 naming both).
        return msgspec.structs.replace(request, sampling_params=replace(params, max_tokens=limit))
    return request


@dataclass(slots=True)
class Deadlines:
    """When (time.monotonic()) a request must have been scheduled, and must have ended."""

    queue_at: float | None
    end_at: float | None
    timeout_s: float | None  # the request's own limit, for the log
    timeout_source: str

    @classmethod
    def start(cls, limits: ServingLimits, timeout_s: float | None) -> "Deadlines":
        """Deadlines from now: --max-queue-time, and the smaller of the request's `timeout` and
        --request-timeout."""
        now = time.monotonic()
        source = "the request's timeout field"
        if limits.request_timeout is not None and (timeout_s is None or limits.request_timeout < timeout_s):
            timeout_s, source = limits.request_timeout, "--request-timeout"
        return cls(
            None if limits.max_queue_time is None else now + limits.max_queue_time,
            None if timeout_s is None else now + timeout_s,
            timeout_s,
            source,
        )

    def wait_s(self, queued: bool) -> float | None:
        """How long the next wait may last (None: unbounded); 0 when a deadline has passed."""
        times = [t for t in (self.queue_at if queued else None, self.end_at) if t is not None]
        return None if not times else max(0.0, min(times) - time.monotonic())

    def queue_expired(self) -> bool:
        return self.queue_at is not None and time.monotonic() >= self.queue_at

    def expired(self) -> bool:
        return self.end_at is not None and time.monotonic() >= self.end_at
