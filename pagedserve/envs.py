"""Environment variables pagedserve reads. Each is optional; a bad value is an error naming the variable."""
import os

from pagedserve.errors import ConfigError


def log_stats_interval_s() -> float:
    """PAGEDSERVE_LOG_STATS_INTERVAL: seconds between two stats log lines of the server (default 10)."""
    raw = os.environ.get("PAGEDSERVE_LOG_STATS_INTERVAL", "10")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"PAGEDSERVE_LOG_STATS_INTERVAL={raw!r} must be a positive number of seconds.")
    return value


def api_key() -> str | None:
    """PAGEDSERVE_API_KEY: the server's API key when --api-key is not given."""
    return os.environ.get("PAGEDSERVE_API_KEY") or None
