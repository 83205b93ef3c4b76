"""Ollama's durations (keep_alive): what Go's time.ParseDuration and Ollama's JSON numbers accept."""

import math

import pytest

from pagedserve.entrypoints.durations import FOREVER, parse_duration
from pagedserve.errors import InvalidRequestError


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("250ms", 0.25),
        ("2h45m30.5s", 9930.5),
        ("300", 300.0),
        ("0", 0.0),
        (0, 0.0),
        (300, 300.0),
        (0.5, 0.5),
        ("-1", FOREVER),
        ("-1m", FOREVER),
        (-1, FOREVER),
        (-(2**64), FOREVER),
        (" 10s ", 10.0),
    ],
)
def test_durations_parse_as_ollama_reads_them(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "value",
    ["", "5x", "m5", "1h-30m", "five minutes", "nan", "inf", "1e3s", "5m" * 40, True, None, [5], {}],
)
def test_what_is_not_a_duration_is_refused_naming_the_field(value):
    with pytest.raises(InvalidRequestError) as info:
        parse_duration(value, "keep_alive")
    assert info.value.param == "keep_alive" and info.value.status_code == 400
    assert "keep_alive" in str(info.value)


@pytest.mark.parametrize("value", [math.nan, math.inf, 2**64, 1e300, "1000000h"])
def test_extremes_are_refused(value):
    with pytest.raises(InvalidRequestError, match="keep_alive"):
        parse_duration(value)
