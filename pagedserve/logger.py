"""Package-wide logging setup: one handler on the `pagedserve` logger, level from PAGEDSERVE_LOGGING_LEVEL."""

import logging

from pagedserve import envs

_FORMAT = "%(levelname)s %(asctime)s [%(name)s] %(message)s"


def init_logger(name: str) -> logging.Logger:
    root = logging.getLogger("pagedserve")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m-%d %H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(envs.logging_level())
        root.propagate = False
    return logging.getLogger(name)
