"""Small helpers with no torch dependency."""

import re

from pagedserve.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(value: int | float | str, flag: str) -> int:
    """'4GiB', '512MB', '1e9' or 1000000 -> bytes. Raises ConfigError naming `flag` on bad input."""
    if isinstance(value, (int, float)):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(
            f"{flag}={value!r} is not a size: use bytes or a number with a unit such as "
            "'4GiB', '512MiB' or '2GB'."
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(num_bytes: int | float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
