"""Every numeric SamplingParams field at its extremes: refused with InvalidRequestError naming the field, or
accepted and then carried to the engine (msgpack) and sampled with (worker metadata + sampler) without
error. The server-side sweep of the same fields is tests/entrypoints/test_hostile_input.py."""

import json
import math
import re

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve.errors import InvalidRequestError
from pagedserve.layers.sampler import Sampler
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import (
    INT64_MAX,
    INT64_MIN,
    BeamSearchParams,
    SamplingParams,
)
from pagedserve.worker.request_state import CachedRequestState
from pagedserve.worker.sampling_inputs import build_sampling_metadata

VOCAB = 32
MAX_LOGPROBS = 20  # --max-logprobs' default
INT_FIELDS = (
    "n",
    "best_of",
    "max_tokens",
    "min_tokens",
    "top_k",
    "seed",
    "logprobs",
    "prompt_logprobs",
    "truncate_prompt_tokens",
)
FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)

# The values that break arithmetic: int64's edges and just past them, uint64's edge, 0 and -1, NaN and
# infinities, floats where ints go, strings, booleans, huge and tiny floats.
EXTREMES = st.sampled_from(
    [
        0,
        1,
        -1,
        2,
        2**31,
        2**63 - 1,
        2**63,
        2**64 - 1,
        2**64,
        -(2**63),
        -(2**63) - 1,
        10**14,
        10**40,
        0.0,
        0.5,
        1.0,
        -0.0,
        1e-30,
        1e-6,
        1e30,
        1e308,
        float("nan"),
        float("inf"),
        float("-inf"),
        2.5,
        "1",
        "abc",
        True,
        None,
        [1],
        {},
    ]
)
VALUES = st.one_of(EXTREMES, st.integers(), st.floats())


def _sample(params: SamplingParams) -> None:
    """What the engine does with accepted params: encode them (the process line), build the worker's
    sampling metadata, sample a token."""
    request = EngineCoreRequest("r", [1, 2, 3], params, 2, 0.0)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=EngineCoreRequest)
    state = CachedRequestState("r", 3, decoded.sampling_params, 2)
    meta = build_sampling_metadata([state], [[1, 2, 3, 4]], VOCAB, torch.device("cpu"))
    logits = torch.randn(1, VOCAB)
    penalized = Sampler().apply_penalties_and_bias(logits, meta)
    assert not penalized.isnan().any() and not penalized.isposinf().any()  # -inf: a banned token
    token = Sampler()(logits, meta).sampled_token_ids
    assert 0 <= int(token[0]) < VOCAB


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(INT_FIELDS + FLOAT_FIELDS),
    value=VALUES,
    other=st.fixed_dictionaries(
        {},
        optional={
            "temperature": st.sampled_from([0.0, 0.7]),
            "seed": st.integers(INT64_MIN, INT64_MAX),
            "top_k": st.integers(-1, INT64_MAX),
        },
    ),
)
def test_numeric_field_is_refused_by_name_or_sampled(field: str, value: object, other: dict) -> None:
    kwargs = {**other, field: value}
    try:
        params = SamplingParams(**kwargs)
    except InvalidRequestError as exc:
        assert exc.param in (field, "min_tokens", "best_of"), (kwargs, exc)  # the pair min/max, best_of/n
        return
    for name in INT_FIELDS:
        got = getattr(params, name)
        assert got is None or (type(got) is int and INT64_MIN <= got <= INT64_MAX), (name, got)
    for name in FLOAT_FIELDS:
        assert math.isfinite(getattr(params, name)), name
    if max(params.logprobs or 0, params.prompt_logprobs or 0) > MAX_LOGPROBS:
        return  # the InputProcessor refuses it (--max-logprobs; tests/engine/test_validation.py)
    _sample(params)


@settings(max_examples=300, deadline=None)
@given(
    bias=st.dictionaries(
        st.one_of(st.integers(-1, VOCAB + 1), st.sampled_from(["3", "x", "1.5", 2**64])),
        st.one_of(st.floats(), st.sampled_from([-100, 100, 101, "1"])),
        max_size=4,
    ),
    stop_token_ids=st.one_of(
        st.none(),
        st.lists(st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([2**63, 1.5, "a"])), max_size=3),
    ),
)
def test_logit_bias_and_stop_token_ids(bias: dict, stop_token_ids: list | None) -> None:
    try:
        params = SamplingParams(logit_bias=bias, stop_token_ids=stop_token_ids, temperature=0.5, min_tokens=1)
    except InvalidRequestError as exc:
        assert exc.param in ("logit_bias", "stop_token_ids")
        return
    if any(not 0 <= token < VOCAB for token in params.logit_bias or {}):
        return  # out of vocabulary: the InputProcessor refuses it (it knows the vocabulary)
    _sample(params)


@pytest.mark.parametrize("seed", [10**14, INT64_MAX, INT64_MIN, -1])
def test_any_int64_seed_samples_reproducibly(seed: int) -> None:
    """The seed the engine died of (seed * 1_000_003 overflowed manual_seed) samples, twice the same."""
    params = SamplingParams(temperature=1.0, seed=seed)
    state = CachedRequestState("r", 3, params, 2)
    logits = torch.randn(1, VOCAB)
    draws = [
        int(
            Sampler()(
                logits, build_sampling_metadata([state], [[1, 2, 3, 4]], VOCAB, torch.device("cpu"))
            ).sampled_token_ids[0]
        )
        for _ in range(2)
    ]
    assert draws[0] == draws[1]


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("seed", 2**63, r"seed must be in \[-9223372036854775808, 9223372036854775807\]"),
        ("top_k", 2**63, r"top_k must be in \[-9223372036854775808, 9223372036854775807\]"),
        ("temperature", float("nan"), "temperature must be a finite number, got nan"),
        ("repetition_penalty", float("inf"), "repetition_penalty must be a finite number, got inf"),
        ("n", 1.5, "n must be an integer, got 1.5"),
        ("max_tokens", "16", "max_tokens must be an integer, got '16'"),
    ],
)
def test_messages_name_the_field_and_range(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field


@pytest.mark.parametrize(
    "key", [" 5", "5 ", "+5", "-0", "\u0663", "\uff15", "5_0", "0x5", "5.0", "\u00b2", 5.0, True]
)
def test_logit_bias_keys_are_ints_or_ascii_digits(key: object) -> None:
    """int() read " 5", "+5", "5_0", "٣", 5.0 and True as token ids; a key is an int or ASCII digits (as over
    HTTP)."""
    with pytest.raises(
        InvalidRequestError, match="is not a token id: logit_bias keys must be token ids"
    ) as info:
        SamplingParams(logit_bias={key: 1.0})
    assert info.value.param == "logit_bias" and "ASCII digits" in str(info.value)
    assert (json.dumps(key) if isinstance(key, str) else repr(key)) in str(info.value)


def test_logit_bias_digit_keys_are_token_ids() -> None:
    assert SamplingParams(logit_bias={"5": 1.0, "007": -1, 9: 2.0}).logit_bias == {5: 1.0, 7: -1.0, 9: 2.0}
    for key in ("9" * 5000, "9223372036854775808"):  # past int(): 4300 digits; past int64
        with pytest.raises(InvalidRequestError, match="logit_bias ") as info:
            SamplingParams(logit_bias={key: 1.0})
        assert info.value.param == "logit_bias"


def test_tiny_temperature_is_greedy() -> None:
    """1e-30 would overflow the logits (logits / temperature); below 1e-5 it is greedy, as in vLLM."""
    assert SamplingParams(temperature=1e-30).greedy and not SamplingParams(temperature=1e-4).greedy


@pytest.mark.parametrize(
    "field,value", [("length_penalty", float("nan")), ("beam_width", 2**64), ("max_tokens", 2.0)]
)
def test_beam_search_params_extremes(field: str, value: object) -> None:
    kwargs = {"beam_width": 2, "max_tokens": 4, field: value}
    with pytest.raises(InvalidRequestError) as info:
        BeamSearchParams(**kwargs)
    assert info.value.param == field


PENALTY_EXTREMES = [1e-308, 1e-45, 1e-30, 3.5e38, 1e300, math.inf, math.nan, 0.0, -0.0, -1.0, 2.0, 1e-6, 1e6]


@pytest.mark.parametrize("field", ["repetition_penalty", "presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", PENALTY_EXTREMES)
def test_penalty_is_refused_with_its_range_or_keeps_logits_finite(field: str, value: float) -> None:
    """repetition_penalty=1e-308 is 0 in float32 (a seen token's positive logit / 0 = inf) and 3.5e38 is inf
    (a zero logit * inf = NaN): the sample was garbage (token 0). Now refused, with the range, or finite."""
    try:
        params = SamplingParams(temperature=0.0, **{field: value})
    except InvalidRequestError as exc:
        assert exc.param == field
        assert re.match(rf"{field} must be (in \[-?[0-9e.+-]+, [0-9e.+-]+\]|a finite number), got ", str(exc))
        return
    logits = torch.linspace(-8.0, 8.0, VOCAB)
    logits[1:5] = torch.tensor([9.0, 0.0, -8.0, 4.0])  # the seen tokens (prompt 1-3, output 4)
    state = CachedRequestState("r", 3, params, 2)
    meta = build_sampling_metadata([state], [[1, 2, 3, 4]], VOCAB, torch.device("cpu"))
    penalized = Sampler().apply_penalties_and_bias(logits[None], meta)
    assert penalized.isfinite().all(), penalized
    assert int(Sampler()(logits[None], meta).sampled_token_ids[0]) == int(penalized.argmax())
