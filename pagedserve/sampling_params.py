"""SamplingParams: vLLM's field names and defaults, validated on construction."""

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pagedserve.errors import InvalidRequestError
from pagedserve.structured_outputs_params import StructuredOutputsParams

# Integer fields travel to the engine as 64-bit integers (msgpack, torch int64): any int outside this range
# is refused here, naming the field, rather than failing inside the engine (vLLM bounds `seed` the same).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Below this temperature sampling is greedy (as in vLLM): dividing logits by a tinier one overflows.
_SAMPLING_EPS = 1e-5
# The sampler divides a seen token's positive logit by repetition_penalty and multiplies a negative one
# by it, in float32. vLLM only asks for > 0, but 1e-308 is 0 in float32 and 3.5e38 is inf: the logits
# turn inf or NaN and the "sample" is token 0. Within this range (10**±6, far past any useful penalty:
# 1 to 2 in practice) a penalized logit stays finite for any |logit| below 1e32 (float32 ends at 3.4e38).
REPETITION_PENALTY_RANGE = (1e-6, 1e6)


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(f"{param} {message}", param=param)


def _check_int(param: str, value: object, optional: bool = False) -> None:
    """`value` is an int (not a bool) within int64, or None when `optional`."""
    if value is None and optional:
        return
    _check(
        isinstance(value, int) and not isinstance(value, bool), param, f"must be an integer, got {value!r}."
    )
    assert isinstance(value, int)  # checked just above (_check raises otherwise)
    _check(
        INT64_MIN <= value <= INT64_MAX,
        param,
        f"must be in [{INT64_MIN}, {INT64_MAX}] (a 64-bit integer), got {value}.",
    )


def _as_float(param: str, value: object) -> float:
    """`value` (an int or float) as a finite float; NaN and infinities are refused (no range check sees NaN)."""
    _check(
        isinstance(value, (int, float)) and not isinstance(value, bool),
        param,
        f"must be a number, got {value!r}.",
    )
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond float's range
        number = math.inf
    _check(math.isfinite(number), param, f"must be a finite number, got {value}.")
    return number


T = TypeVar("T")


def wrap_int64(value: int) -> int:
    """`value` wrapped into the int64 range (two's complement), e.g. a derived seed."""
    return (value - INT64_MIN) % 2**64 + INT64_MIN


def _as_list(param: str, value: Sequence[T] | None) -> list[T]:
    """A list field's value as a list (None: empty), or InvalidRequestError."""
    _check(value is None or isinstance(value, (list, tuple)), param, f"must be a list, got {value!r}.")
    return list(value or [])


def logit_bias_token_ids(bias: Mapping[int, float] | Mapping[str, float] | None) -> dict[int, float] | None:
    """logit_bias with token ids as ints and biases as floats (None when empty), or InvalidRequestError
    naming the bad entry. A key is an int, or a string of ASCII digits (JSON's keys are strings)."""
    if not bias:
        return None
    if not isinstance(bias, Mapping):
        raise InvalidRequestError(
            f"logit_bias must map token ids to biases, got {bias!r}.", param="logit_bias"
        )
    result = {}
    for token, value in bias.items():
        token_id = _token_id(token)
        _check_int("logit_bias", token_id)
        result[token_id] = _as_float("logit_bias", value)
    return result


def _token_id(key: object) -> int:
    """A logit_bias key as a token id: an int, or a string of ASCII digits. (int() alone would also read
    " 5", "+5", "5_0", 5.0 and other scripts' digits, "٣".)"""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.isascii() and key.isdigit():
        # NOTE: int() refuses over 4300 digits; past 19 (leading zeros aside) it is no int64 anyway.
        _check(
            len(key.lstrip("0")) <= 19, "logit_bias", f"keys must be 64-bit token ids, got {len(key)} digits."
        )
        return int(key)
    shown = json.dumps(key) if isinstance(key, str) else repr(key)
    raise InvalidRequestError(
        f"logit_bias key {shown} is not a token id: logit_bias keys must be token ids, integers or strings "
        'of ASCII digits only (0-9, e.g. "50256").',
        param="logit_bias",
    )


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
    # With --reasoning-parser: after this many thinking tokens the end-of-thinking token is forced (None:
    # the server's --thinking-token-budget, else no limit).
    thinking_token_budget: int | None = None
    stop_strings: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stop_strings = [self.stop] if isinstance(self.stop, str) else _as_list("stop", self.stop)
        self.stop_token_ids = _as_list("stop_token_ids", self.stop_token_ids)
        self.logit_bias = logit_bias_token_ids(self.logit_bias)
        self._validate()
        if self.temperature < _SAMPLING_EPS:
            self.temperature = 0.0  # greedy

    def _validate(self) -> None:
        """Every field's type first (so the range checks compare numbers), then each group's ranges. The
        order is the order of the errors a request with several bad fields gets: the first one raises."""
        self._check_types()
        self._check_sampling_ranges()
        self._check_length_limits()
        self._check_stops_and_bias()

    def _check_types(self) -> None:
        """Integer fields are int64 ints; float fields become finite floats (an int 1 reads as 1.0)."""
        for name in ("n", "top_k", "min_tokens"):
            _check_int(name, getattr(self, name))
        for name in (
            "best_of",
            "seed",
            "max_tokens",
            "logprobs",
            "prompt_logprobs",
            "truncate_prompt_tokens",
            "thinking_token_budget",
        ):
            _check_int(name, getattr(self, name), optional=True)
        for name in (
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "temperature",
            "top_p",
            "min_p",
        ):
            setattr(self, name, _as_float(name, getattr(self, name)))

    def _check_sampling_ranges(self) -> None:
        """How many samples, and the knobs that shape each token's distribution (vLLM's ranges)."""
        _check(self.n >= 1, "n", f"must be at least 1, got {self.n}.")
        if self.best_of is not None:
            _check(self.best_of >= self.n, "best_of", f"must be at least n={self.n}, got {self.best_of}.")
        _check(self.temperature >= 0.0, "temperature", f"must be non-negative, got {self.temperature}.")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}.")
        _check(self.top_k >= -1, "top_k", f"must be -1 or 0 (disable), or at least 1, got {self.top_k}.")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}.")
        _check(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"must be in [-2, 2], got {self.presence_penalty}.",
        )
        _check(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty}.",
        )
        low, high = REPETITION_PENALTY_RANGE
        _check(
            low <= self.repetition_penalty <= high,
            "repetition_penalty",
            f"must be in [{low:g}, {high:g}], got {self.repetition_penalty}.",
        )

    def _check_length_limits(self) -> None:
        """Token counts: the output's bounds (min_tokens within max_tokens), logprobs, the prompt's cut."""
        if self.max_tokens is not None:
            _check(self.max_tokens >= 1, "max_tokens", f"must be at least 1, got {self.max_tokens}.")
        _check(self.min_tokens >= 0, "min_tokens", f"must be non-negative, got {self.min_tokens}.")
        if self.max_tokens is not None:
            _check(
                self.min_tokens <= self.max_tokens,
                "min_tokens",
                f"must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}.",
            )
        for name in ("logprobs", "prompt_logprobs", "thinking_token_budget"):
            value = getattr(self, name)
            _check(value is None or value >= 0, name, f"must be non-negative, got {value}.")
        if self.truncate_prompt_tokens is not None:
            _check(
                self.truncate_prompt_tokens >= 1,
                "truncate_prompt_tokens",
                f"must be at least 1, got {self.truncate_prompt_tokens}.",
            )

    def _check_stops_and_bias(self) -> None:
        """The list fields' entries (__post_init__ made them lists): stop strings, stop token ids, biases."""
        _check(
            all(isinstance(s, str) for s in self.stop_strings),
            "stop",
            "must be a string or a list of strings.",
        )
        _check(all(self.stop_strings), "stop", "must not contain empty strings.")
        for token in self.stop_token_ids or ():
            _check_int("stop_token_ids", token)
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
        _check_int("beam_width", self.beam_width)
        _check_int("max_tokens", self.max_tokens)
        self.length_penalty = _as_float("length_penalty", self.length_penalty)
        _check(self.beam_width >= 1, "beam_width", f"must be at least 1, got {self.beam_width}.")
        _check(self.max_tokens >= 1, "max_tokens", f"must be at least 1, got {self.max_tokens}.")
        _check(
            self.early_stopping in (True, False, "never"),
            "early_stopping",
            f"must be true, false or 'never', got {self.early_stopping!r}.",
        )


# The fields that shape sampling only, and their values that change nothing. A beam search ranks by the
# model's log-probabilities (HF's beam search, do_sample=False), processed by the penalties and logit_bias:
# any other value of these is refused, never silently ignored (nor is a model default of them applied).
SAMPLING_ONLY_FIELDS: dict[str, tuple[float, ...]] = {
    "temperature": (0.0, 1.0),
    "top_p": (1.0,),
    "top_k": (0, -1),
    "min_p": (0.0,),
}


def beam_search_defaults(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The model's sampling defaults (--generation-config) a beam search takes: all but the sampling knobs,
    which it ignores as HF's beam search does (a request setting one is refused instead)."""
    return {name: value for name, value in defaults.items() if name not in SAMPLING_ONLY_FIELDS}


def check_beam_search_fields(params: SamplingParams) -> None:
    """Raise InvalidRequestError naming the first field of `params` a beam search cannot honour: a sampling
    knob (SAMPLING_ONLY_FIELDS) or stop strings (a beam ends on tokens: EOS, stop_token_ids)."""
    for name, neutral in SAMPLING_ONLY_FIELDS.items():
        value = getattr(params, name)
        _check(
            value in neutral,
            name,
            f"cannot be combined with beam search, got {value}: beams rank continuations by the model's "
            f"log-probabilities (HF's beam search), so {name} would change nothing. Leave it unset "
            f"(or {' or '.join(f'{v:g}' for v in neutral)}), or drop use_beam_search.",
        )
    _check(
        not params.stop_strings,
        "stop",
        "strings cannot be combined with beam search (a beam ends on a token: EOS or stop_token_ids): "
        "drop stop, or pass the stop tokens' ids as stop_token_ids.",
    )
