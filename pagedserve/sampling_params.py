"""SamplingParams: vLLM's field names and defaults, validated on construction."""
import enum
from dataclasses import dataclass, field

from pagedserve.errors import InvalidRequestError
from pagedserve.structured_outputs_params import StructuredOutputsParams


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(f"{param} {message}", param=param)


class RequestOutputKind(enum.IntEnum):
    """What each RequestOutput of a request carries (vLLM's names)."""

    CUMULATIVE = 0  # everything generated so far (the offline LLM)
    DELTA = 1  # only what is new since the previous output (streaming)
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass
class SamplingParams:
    """How to sample one request's output. `temperature=0` is greedy; `max_tokens=None` means the rest of
    the context window. Raises InvalidRequestError naming the field and its allowed range."""

    n: int = 1
    best_of: int | None = None  # sample this many, return the n with the highest cumulative logprob
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: all tokens
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None  # constrain the output (JSON schema, regex...)
    stop_strings: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop_strings = [self.stop]
        else:
            self.stop_strings = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        self._validate()

    def _validate(self) -> None:
        _check(self.n >= 1, "n", f"must be at least 1, got {self.n}.")
        if self.best_of is not None:
            _check(self.best_of >= self.n, "best_of", f"must be at least n={self.n}, got {self.best_of}.")
        _check(self.temperature >= 0.0, "temperature", f"must be non-negative, got {self.temperature}.")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}.")
        _check(self.top_k >= -1, "top_k", f"must be -1 or 0 (disable), or at least 1, got {self.top_k}.")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}.")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty",
               f"must be in [-2, 2], got {self.presence_penalty}.")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
               f"must be in [-2, 2], got {self.frequency_penalty}.")
        _check(self.repetition_penalty > 0.0, "repetition_penalty",
               f"must be greater than zero, got {self.repetition_penalty}.")
        if self.max_tokens is not None:
            _check(self.max_tokens >= 1, "max_tokens", f"must be at least 1, got {self.max_tokens}.")
        _check(self.min_tokens >= 0, "min_tokens", f"must be non-negative, got {self.min_tokens}.")
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens",
                   f"must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}.")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or value >= 0, name, f"must be non-negative, got {value}.")
        if self.truncate_prompt_tokens is not None:
            _check(self.truncate_prompt_tokens >= 1, "truncate_prompt_tokens",
                   f"must be at least 1, got {self.truncate_prompt_tokens}.")
        _check(all(s for s in self.stop_strings), "stop", "must not contain empty strings.")
        for bias in (self.logit_bias or {}).values():
            _check(-100.0 <= bias <= 100.0, "logit_bias", f"values must be in [-100, 100], got {bias}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def num_samples(self) -> int:
        """How many sequences the engine generates: best_of when set, else n."""
        return self.best_of or self.n


@dataclass
class BeamSearchParams:
    """Beam search with HF transformers' semantics (`num_beams=beam_width`, `length_penalty`,
    `early_stopping`): each step keeps the `beam_width` best continuations by cumulative logprob;
    a beam that emits EOS (unless `ignore_eos`) or reaches `max_tokens` becomes a hypothesis scored
    cumulative_logprob / generated_length ** length_penalty. `early_stopping`: True stops once
    `beam_width` hypotheses exist; False (HF's default) stops when the best running beam, scored at
    its current length, cannot beat the worst hypothesis; "never" scores it at `max_tokens` instead
    (when length_penalty > 0). Raises InvalidRequestError naming the field."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        _check(self.beam_width >= 1, "beam_width", f"must be at least 1, got {self.beam_width}.")
        _check(self.max_tokens >= 1, "max_tokens", f"must be at least 1, got {self.max_tokens}.")
        _check(self.early_stopping in (True, False, "never"), "early_stopping",
               f"must be true, false or 'never', got {self.early_stopping!r}.")
