"""Package-wide logging setup: one handler on the `pagedserve` logger, level from PAGEDSERVE_LOGGING_LEVEL."""

import logging
import os

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_FORMAT = "%(levelname)s %(asctime)s [%(name)s] %(message)s"


def init_logger(name: str) -> logging.Logger:
    root = logging.getLogger("pagedserve")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m-%d %H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging_level())
        root.propagate = False
    return logging.getLogger(name)


def logging_level() -> str:
    """PAGEDSERVE_LOGGING_LEVEL: the level of pagedserve's log (default INFO; any case). Raises ValueError
    naming the variable (this module sits below pagedserve.errors' ConfigError in the layers)."""
    raw = os.environ.get("PAGEDSERVE_LOGGING_LEVEL", "INFO")
    if raw.upper() not in LEVELS:
        raise ValueError(f"PAGEDSERVE_LOGGING_LEVEL={raw!r} must be one of {', '.join(LEVELS)}.")
    return raw.upper()
