"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) in front of an AsyncLLM.

    python -m pagedserve.entrypoints.openai.api_server --model PATH [flags]   (or: pagedserve serve PATH)

The port is bound first (a taken port fails fast), then the engine process starts, and only once it is
ready does the server accept connections. If the engine dies, requests in flight end with an error,
/health answers 503, and the process exits with status 1 shortly after, for a supervisor to restart it.
"""
import argparse
import asyncio
import secrets
import signal
import socket
import sys
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedserve import __version__, envs
from pagedserve.config import EngineArgs
from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.entrypoints.chat_utils import load_chat_template
from pagedserve.entrypoints.openai.cli_args import ServerArgs, args_from_namespace, make_arg_parser
from pagedserve.entrypoints.openai.errors import error_response, register_error_handlers
from pagedserve.entrypoints.openai.protocol import (ChatCompletionRequest, ChatCompletionResponse,
                                                    CompletionRequest, CompletionResponse, DetokenizeRequest,
                                                    DetokenizeResponse, ModelCard, ModelList,
                                                    TokenizeRequest, TokenizeResponse)
from pagedserve.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedserve.entrypoints.openai.serving_completion import OpenAIServingCompletion
from pagedserve.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from pagedserve.entrypoints.utils import with_cancellation
from pagedserve.errors import PagedServeError
from pagedserve.logger import init_logger
from pagedserve.metrics.loggers import LoggingStatLogger, StatLoggerBase
from pagedserve.metrics.prometheus import CONTENT_TYPE, PrometheusStatLogger

# NOTE: not __name__, which is __main__ under `python -m` (outside the package's logger).
logger = init_logger("pagedserve.entrypoints.openai.api_server")

# After the engine dies: how long /health keeps answering 503 (and errors reach the clients) before exit.
ENGINE_DEATH_GRACE_S = 2.0
_GRACEFUL_SHUTDOWN_S = 5


class ApiKeyMiddleware:
    """401 on the /v1 routes unless `Authorization: Bearer <key>`; /health, /metrics, /version and the
    tokenizer routes stay open. Pure ASGI, so streamed responses and disconnects pass untouched."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = Headers(scope=scope).get("authorization", "").encode()
            if not secrets.compare_digest(given, self.expected):
                response = error_response("Missing or wrong API key: send the header `Authorization: Bearer "
                                          "<key>` with the key the server was started with (--api-key or "
                                          "PAGEDSERVE_API_KEY).", 401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(engine: AsyncLLM, server_args: ServerArgs, metrics: PrometheusStatLogger,
              chat_template: str | None) -> FastAPI:
    """The FastAPI application around a started engine."""
    app = FastAPI(title="pagedserve", version=__version__)
    register_error_handlers(app)
    api_key = server_args.resolved_api_key()
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    model_name = engine.config.model.served_model_name
    chat = OpenAIServingChat(engine, model_name, chat_template)
    _add_generation_routes(app, OpenAIServingCompletion(engine, model_name), chat)
    _add_info_routes(app, engine, metrics)
    tokenization = OpenAIServingTokenization(engine, model_name, chat.render)

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> TokenizeResponse:
        return tokenization.tokenize(request)

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        return tokenization.detokenize(request)

    return app


def _add_generation_routes(app: FastAPI, completion: OpenAIServingCompletion,
                           chat: OpenAIServingChat) -> None:
    @app.post("/v1/completions", response_model=None)
    @with_cancellation
    async def create_completion(request: CompletionRequest, raw_request: Request
                                ) -> CompletionResponse | StreamingResponse:
        return await completion.create_completion(request)

    @app.post("/v1/chat/completions", response_model=None)
    @with_cancellation
    async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request
                                     ) -> ChatCompletionResponse | StreamingResponse:
        return await chat.create_chat_completion(request)


def _add_info_routes(app: FastAPI, engine: AsyncLLM, metrics: PrometheusStatLogger) -> None:
    model = engine.config.model

    @app.get("/health")
    async def health() -> Response:
        if engine.errored:
            return error_response("The engine is dead; the server is shutting down.", 503)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/metrics")
    async def get_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        return ModelList(data=[ModelCard(id=model.served_model_name, root=model.model,
                                         max_model_len=model.max_model_len)])


def _bind_socket(host: str, port: int) -> socket.socket:
    """Reserve the port before the (slow) engine start, so a taken port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PagedServeError(f"Cannot listen on {host}:{port}: {exc.strerror}. Choose another --port "
                              "(or --host).") from exc
    return sock


async def _exit_when_engine_dies(engine: AsyncLLM, server: uvicorn.Server) -> None:
    await engine.dead_event.wait()
    logger.error("The engine is dead: /health answers 503 and the server exits (status 1) in %.0f s; "
                 "restart it.", ENGINE_DEATH_GRACE_S)
    await asyncio.sleep(ENGINE_DEATH_GRACE_S)
    server.should_exit = True


async def run_server(engine_args: EngineArgs, server_args: ServerArgs) -> int:
    """Serve until stopped (status 0) or until the engine dies (status 1). Raises PagedServeError
    (ConfigError included) when the settings cannot be served."""
    config = engine_args.create_engine_config()
    chat_template = load_chat_template(server_args.chat_template)
    sock = _bind_socket(server_args.host, server_args.port)
    metrics = PrometheusStatLogger(config.model.served_model_name)
    stat_loggers: list[StatLoggerBase] = [metrics]
    if not server_args.disable_log_stats:
        stat_loggers.append(LoggingStatLogger())
    engine = await AsyncLLM.create(config, stat_loggers, not server_args.disable_log_requests,
                                   envs.log_stats_interval_s())
    try:
        app = build_app(engine, server_args, metrics, chat_template)
        server = uvicorn.Server(uvicorn.Config(app, log_level=server_args.uvicorn_log_level,
                                               timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S))
        watchdog = asyncio.create_task(_exit_when_engine_dies(engine, server))
        logger.info("Serving %s at http://%s:%d (OpenAI API under /v1).", config.model.served_model_name,
                    server_args.host, server_args.port)
        await server.serve(sockets=[sock])
        watchdog.cancel()
    finally:
        engine.shutdown()
        sock.close()
    return 1 if engine.dead_error is not None else 0


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    """Run the server from parsed flags; returns the process exit status."""
    # NOTE: SIGTERM unwinds like Ctrl-C, so the engine process is shut down rather than orphaned.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    engine_args, server_args = args_from_namespace(args)
    try:
        return asyncio.run(run_server(engine_args, server_args))
    except PagedServeError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        logger.info("Stopped.")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedserve.entrypoints.openai.api_server",
                                     description="OpenAI-compatible server for pagedserve (vLLM's flags).")
    return run(make_arg_parser(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
