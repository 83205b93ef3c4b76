"""--api-key (else PAGEDSERVE_API_KEY, else VLLM_API_KEY): every route requires `Authorization: Bearer
<key>` except the probes (/health, /ready), /version, and /metrics unless --metrics-require-api-key
(vLLM leaves it open for scrapers). An allow-list, so a route added later is protected by default."""

import secrets

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedserve.entrypoints.openai.errors import error_response

PROBE_PATHS = frozenset({"/health", "/ready", "/version"})
METRICS_PATH = "/metrics"


def open_paths(metrics_require_api_key: bool) -> frozenset[str]:
    """The paths answered without the key."""
    return PROBE_PATHS if metrics_require_api_key else PROBE_PATHS | {METRICS_PATH}


class ApiKeyMiddleware:
    """401 with an OpenAI error body unless the key is sent, on every path but `open_paths`. Pure ASGI, so
    streamed responses and disconnects pass untouched."""

    def __init__(self, app: ASGIApp, api_key: str, metrics_require_api_key: bool = False) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = open_paths(metrics_require_api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            given = Headers(scope=scope).get("authorization", "").encode()
            if not secrets.compare_digest(given, self.expected):
                response = error_response(
                    "Missing or wrong API key: send the header `Authorization: Bearer "
                    "<key>` with the key the server was started with (--api-key, "
                    "PAGEDSERVE_API_KEY or VLLM_API_KEY).",
                    401,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
