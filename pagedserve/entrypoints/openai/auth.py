"""--api-key (else PAGEDSERVE_API_KEY, else VLLM_API_KEY): every route requires `Authorization: Bearer
<key>` (or Anthropic's `x-api-key: <key>`) except the probes (/health, /ping, /ready, and Ollama's `/` and
/api/version, which its clients ask before anything else), /version, and /metrics
unless --metrics-require-api-key (vLLM leaves it open for scrapers). An allow-list, so a route added later
is protected by default."""

import hashlib
import secrets

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedserve.entrypoints.openai.errors import error_response

PROBE_PATHS = frozenset({"/health", "/ping", "/ready", "/version", "/", "/api/version"})
METRICS_PATH = "/metrics"


def open_paths(metrics_require_api_key: bool) -> frozenset[str]:
    """The paths answered without the key."""
    return PROBE_PATHS if metrics_require_api_key else PROBE_PATHS | {METRICS_PATH}


def presented_key(headers: Headers) -> str:
    """The key a request sent: its `Authorization: Bearer` token, else its `x-api-key` ("" for none)."""
    authorization = headers.get("authorization", "")
    if authorization.startswith("Bearer "):
        return authorization.removeprefix("Bearer ")
    return headers.get("x-api-key", "")


def key_scope(headers: Headers) -> str:
    """Whose a stored object is: a digest of the key the request sent (the key itself is never kept)."""
    return hashlib.sha256(presented_key(headers).encode()).hexdigest()


class ApiKeyMiddleware:
    """401 with an error body (the route's API's shape) unless the key is sent, on every path but
    `open_paths`. Pure ASGI, so streamed responses and disconnects pass untouched."""

    def __init__(self, app: ASGIApp, api_key: str, metrics_require_api_key: bool = False) -> None:
        self.app = app
        self.expected = api_key.encode()
        self.open_paths = open_paths(metrics_require_api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            given = presented_key(Headers(scope=scope)).encode()
            if not secrets.compare_digest(given, self.expected):
                response = error_response(
                    "Missing or wrong API key: send the header `Authorization: Bearer "
                    "<key>` (or `x-api-key: <key>`) with the key the server was started with "
                    "(--api-key, PAGEDSERVE_API_KEY or VLLM_API_KEY).",
                    401,
                    path=scope["path"],
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
