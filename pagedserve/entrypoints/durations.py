"""Ollama's durations, as `keep_alive` (per request) and `--keep-alive` take them: a JSON number of seconds
(300, 0.5), or a string: Go's duration syntax ("5m", "1h30m", "1.5h", "250ms", "-1m") or a bare number of
seconds ("300"). 0 means at once; any negative value means forever. Shared by the model pool and the Ollama
routes so both read `keep_alive` the same way."""

import math
import re

from pagedserve.errors import InvalidRequestError

FOREVER = math.inf

# Beyond this a keep_alive is surely a mistake (Go's time.Duration overflows near 292 years).
MAX_DURATION_S = 100 * 365 * 24 * 3600.0
MAX_DURATION_CHARS = 64

_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+\.?\d*|\.\d+)"
_TERM = re.compile(rf"({_NUMBER})(ns|us|µs|μs|ms|s|m|h)")
_GO_DURATION = re.compile(rf"(?:{_NUMBER}(?:ns|us|µs|μs|ms|s|m|h))+")
_BARE_SECONDS = re.compile(_NUMBER)


def parse_duration(value: object, field: str = "keep_alive") -> float:
    """Seconds (FOREVER for a negative value). Raises InvalidRequestError (400) naming `field` for anything
    that is not a duration: wrong types (booleans included), NaN, infinities, unknown units, values past
    100 years."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _invalid(field, f"a number of seconds or a duration string, not {type(value).__name__}")
    seconds = _seconds_of_string(value, field) if isinstance(value, str) else float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise _invalid(field, f"a finite duration, not {value!r}")
    if seconds < 0:
        return FOREVER
    if seconds > MAX_DURATION_S:
        raise _invalid(field, f"at most {MAX_DURATION_S:.0f} s (100 years; a negative value means forever)")
    return seconds


def _seconds_of_string(text: str, field: str) -> float:
    if len(text) > MAX_DURATION_CHARS:
        raise _invalid(field, f"at most {MAX_DURATION_CHARS} characters")
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    if _BARE_SECONDS.fullmatch(body):
        return sign * float(body)
    if not _GO_DURATION.fullmatch(body):
        shown = text if len(text) <= 20 else text[:20] + "..."
        raise _invalid(field, f'a duration like "5m", "1h30m", "300" or -1, not {shown!r}')
    return sign * sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _TERM.findall(body))


def _invalid(field: str, expected: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"`{field}` must be {expected}: 0 unloads at once, a negative value keeps the model forever.",
        param=field,
    )
