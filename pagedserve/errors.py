"""Error hierarchy. Messages say what was wrong, the limit, and the flag or field to change."""


class PagedServeError(Exception):
    """Base of every error pagedserve raises on purpose."""


class InvalidRequestError(PagedServeError, ValueError):
    """A request (prompt or sampling parameters) is invalid. HTTP 400 (404 for an unknown model)."""

    def __init__(self, message: str, param: str | None = None, status_code: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status_code = status_code


class ConfigError(PagedServeError, ValueError):
    """An engine setting is invalid or cannot be satisfied (e.g. the KV cache cannot hold one request)."""


class CapacityError(PagedServeError):
    """The engine is full (queue limits). HTTP 429/503 with Retry-After."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestFailedError(PagedServeError):
    """One request could not be sent to or taken by the engine (its input failed to encode, decode or be
    admitted there); the engine and the other requests go on. HTTP 500: the API's checks let it through."""


class EngineDeadError(PagedServeError):
    """The engine process died or stalled; no request can be served. HTTP 503."""


class EngineAsleepError(PagedServeError):
    """The engine sleeps (POST /sleep) and the server does not wake it for requests. HTTP 503."""
