"""One timing helper for the micro-benchmarks."""

import statistics
import time
from collections.abc import Callable


def median_seconds(call: Callable[[], object], iterations: int, warmup: int = 3) -> float:
    """Median wall time of `call` over `iterations` runs, after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
