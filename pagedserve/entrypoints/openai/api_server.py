"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) in front of an AsyncLLM.

    python -m pagedserve.entrypoints.openai.api_server --model PATH [flags]   (or: pagedserve serve PATH)

The port is bound first (a taken port fails fast) and the server answers at once: GET /health and
GET /ready answer 503 while the engine process loads the model, 200 once it serves (see lifecycle.py).
If the engine dies or stalls (--engine-stall-timeout), requests in flight end with an
error, /health answers 503, and the process exits with status 1 shortly after, for a supervisor to
restart it. SIGTERM drains: no new requests, those in flight get --shutdown-timeout seconds, exit 0.
With --models-dir or --model NAME=PATH, several models are served instead, each loaded on demand in an
engine process of its own (pool_server.py, model_pool.py); one dying only unloads it.
"""

import argparse
import asyncio
import functools
import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import ASGIApp

from pagedserve import __version__, envs
from pagedserve.config import EngineArgs
from pagedserve.config.frontend_config import FrontendConfig, resolve_frontend_config
from pagedserve.engine.admission import ServingLimits
from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.engine.dp_headless import run_headless
from pagedserve.entrypoints.chat_utils import load_chat_template
from pagedserve.entrypoints.openai.auth import ApiKeyMiddleware
from pagedserve.entrypoints.openai.cli_args import ServerArgs, args_from_namespace, make_arg_parser
from pagedserve.entrypoints.openai.dashboard import add_dashboard_routes
from pagedserve.entrypoints.openai.errors import ERROR_RESPONSES, register_error_handlers
from pagedserve.entrypoints.openai.invocations import InvocationsMiddleware
from pagedserve.entrypoints.openai.lifecycle import LifecycleServer, ServerLifecycle
from pagedserve.entrypoints.openai.lora_routes import add_lora_routes
from pagedserve.entrypoints.openai.messages_routes import add_messages_routes
from pagedserve.entrypoints.openai.model_pool import ModelPool
from pagedserve.entrypoints.openai.ollama_models import OllamaModels
from pagedserve.entrypoints.openai.ollama_routes import add_ollama_routes
from pagedserve.entrypoints.openai.pool_server import EngineStarter, pool_models, serve_pool
from pagedserve.entrypoints.openai.pooling_routes import add_pooling_routes
from pagedserve.entrypoints.openai.protocol_chat import ChatCompletionRequest, ChatCompletionResponse
from pagedserve.entrypoints.openai.protocol_completion import CompletionRequest, CompletionResponse
from pagedserve.entrypoints.openai.protocol_models import ModelCard, ModelList
from pagedserve.entrypoints.openai.protocol_tokenization import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from pagedserve.entrypoints.openai.request_bounds import BodySizeLimitMiddleware, RequestBounds
from pagedserve.entrypoints.openai.response_store import ResponseStore
from pagedserve.entrypoints.openai.responses_routes import add_responses_routes
from pagedserve.entrypoints.openai.served_models import ServedModels, serve_lora_modules
from pagedserve.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedserve.entrypoints.openai.serving_completion import OpenAIServingCompletion
from pagedserve.entrypoints.openai.serving_messages import AnthropicServingMessages
from pagedserve.entrypoints.openai.serving_ollama import OllamaServing
from pagedserve.entrypoints.openai.serving_pooling import OpenAIServingPooling
from pagedserve.entrypoints.openai.serving_responses import OpenAIServingResponses
from pagedserve.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from pagedserve.entrypoints.openai.sleep_routes import add_sleep_routes
from pagedserve.entrypoints.openai.stat_loggers import StatLoggers, record_engine
from pagedserve.entrypoints.openai.unicode_text import reject_lone_surrogates
from pagedserve.entrypoints.utils import with_cancellation
from pagedserve.errors import ConfigError, PagedServeError
from pagedserve.logger import init_logger
from pagedserve.metrics.prometheus import CONTENT_TYPE, PrometheusStatLogger

# NOTE: not __name__, which is __main__ under `python -m` (outside the package's logger).
logger = init_logger("pagedserve.entrypoints.openai.api_server")

# After the engine dies: how long /health keeps answering 503 (and errors reach the clients) before exit.
ENGINE_DEATH_GRACE_S = 2.0
_GRACEFUL_SHUTDOWN_S = 5


def build_app(
    engine: AsyncLLM,
    server_args: ServerArgs,
    loggers: StatLoggers,
    chat_template: str | None,
    bounds: RequestBounds,
) -> FastAPI:
    """The FastAPI application around a started engine (the probes are ServerLifecycle's)."""
    app = FastAPI(title="pagedserve", version=__version__, dependencies=[Depends(reject_lone_surrogates)])
    register_error_handlers(app)
    app.add_middleware(InvocationsMiddleware)  # NOTE: first, so innermost: behind the key and body limit
    add_guards(app, server_args, bounds)
    models = serve_lora_modules(ServedModels(engine), server_args.lora_modules)
    chat = OpenAIServingChat(
        engine,
        models,
        chat_template,
        server_args.auto_tool_parser,
        server_args.chat_template_content_format,
    )
    completion = OpenAIServingCompletion(engine, models)
    pooling = OpenAIServingPooling(engine, models)
    _add_generation_routes(app, completion, chat, bounds)
    add_pooling_routes(app, pooling, bounds)
    store = ResponseStore(server_args.max_stored_responses, server_args.max_stored_response_bytes)
    loggers.metrics.server_gauge(
        "stored_responses", "Responses kept by the Responses API (store).", store.__len__
    )
    loggers.metrics.server_gauge(
        "stored_responses_bytes",
        "Bytes (JSON) of the responses the Responses API keeps.",
        lambda: store.num_bytes,
    )
    add_responses_routes(app, OpenAIServingResponses(chat, bounds, store))
    add_messages_routes(app, AnthropicServingMessages(chat, bounds))
    add_ollama_routes(app, OllamaServing(OllamaModels(models, chat), chat, completion, pooling, bounds))
    _add_info_routes(app, engine, models, loggers.metrics)
    add_dashboard_routes(app, engine, loggers.dashboard)
    if server_args.enable_sleep_mode:
        add_sleep_routes(app, engine, server_args.wake_on_request)
    if envs.allow_runtime_lora_updating():
        add_lora_routes(app, models)
    tokenization = OpenAIServingTokenization(engine, models, chat.render)

    @app.post("/tokenize", responses=ERROR_RESPONSES)
    async def tokenize(request: TokenizeRequest) -> TokenizeResponse:
        bounds.check_chat_template(request)
        return await tokenization.tokenize(request)

    @app.post("/detokenize", responses=ERROR_RESPONSES)
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        return tokenization.detokenize(request)

    return app


def add_guards(app: FastAPI, server_args: ServerArgs, bounds: RequestBounds) -> None:
    """The body-size limit, the API key and CORS, in front of every route of `app`."""
    # NOTE: the last added runs first: the key is checked before a body is read.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=bounds.max_request_body_bytes)
    api_key = server_args.resolved_api_key()
    if api_key:
        app.add_middleware(
            ApiKeyMiddleware, api_key=api_key, metrics_require_api_key=server_args.metrics_require_api_key
        )
    origins = server_args.cors_origins()
    if origins:  # NOTE: added last, so it runs first: a preflight (OPTIONS) never needs the key
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"])


def _responses(model: type) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses of a generation route: JSON, or server-sent events when streaming."""
    return {
        200: {
            "model": model,
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "The result (JSON), or with stream=true its chunks as server-sent events",
        },
        **ERROR_RESPONSES,
    }


def _add_generation_routes(
    app: FastAPI, completion: OpenAIServingCompletion, chat: OpenAIServingChat, bounds: RequestBounds
) -> None:
    @app.post("/v1/completions", response_model=None, responses=_responses(CompletionResponse))
    @with_cancellation
    async def create_completion(
        request: CompletionRequest, raw_request: Request
    ) -> CompletionResponse | StreamingResponse:
        bounds.check_completion(request)
        return await completion.create_completion(request)

    @app.post("/v1/chat/completions", response_model=None, responses=_responses(ChatCompletionResponse))
    @with_cancellation
    async def create_chat_completion(
        request: ChatCompletionRequest, raw_request: Request
    ) -> ChatCompletionResponse | StreamingResponse:
        bounds.check_chat(request)
        return await chat.create_chat_completion(request)


def _add_info_routes(
    app: FastAPI, engine: AsyncLLM, models: ServedModels, metrics: PrometheusStatLogger
) -> None:
    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.post(
        "/reset_prefix_cache", response_class=Response, responses={200: {"description": "Done (no body)"}}
    )
    async def reset_prefix_cache() -> Response:
        """Make the engine forget its cached KV blocks (vLLM's route)."""
        await engine.reset_prefix_cache()
        return Response(status_code=200)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def get_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        return ModelList(data=models.cards())

    # NOTE: `path`: served names may hold slashes (org/name), sent as such or as %2F (the openai client).
    @app.get("/v1/models/{model:path}", responses=ERROR_RESPONSES)
    async def retrieve_model(model: str) -> ModelCard:
        return models.card(model)


def _bind_socket(host: str, port: int) -> socket.socket:
    """Reserve the port before the (slow) engine start, so a taken port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PagedServeError(
            f"Cannot listen on {host}:{port}: {exc.strerror}. Choose another --port (or --host)."
        ) from exc
    return sock


async def _exit_when_engine_dies(engine: AsyncLLM, server: uvicorn.Server) -> None:
    await engine.dead_event.wait()
    logger.error(
        "The engine is dead: /health answers 503 and the server exits (status 1) in %.0f s; restart it.",
        ENGINE_DEATH_GRACE_S,
    )
    await asyncio.sleep(ENGINE_DEATH_GRACE_S)
    server.should_exit = True


async def _start_engine(
    resolved: FrontendConfig,
    limits: ServingLimits,
    server_args: ServerArgs,
    loggers: StatLoggers,
    serving: "asyncio.Task[None]",
) -> AsyncLLM | None:
    """Start the engine while the server already answers the probes; None if the server was stopped
    (SIGTERM) before the engine was ready (its process is then gone)."""
    loading = asyncio.create_task(_create_engine(resolved, loggers, server_args, limits))
    await asyncio.wait({loading, serving}, return_when=asyncio.FIRST_COMPLETED)
    if loading.done():
        return loading.result()
    logger.info("Stopped while the model was loading.")
    loading.cancel()
    await asyncio.gather(loading, return_exceptions=True)
    return None


async def run_server(
    engine_args: EngineArgs,
    server_args: ServerArgs,
    limits: ServingLimits | None = None,
    bounds: RequestBounds | None = None,
) -> int:
    """Serve until stopped (status 0) or until the engine dies (status 1; with a pool of models, one model's
    engine dying only unloads it). Raises PagedServeError (ConfigError included) when the settings cannot
    be served."""
    limits, bounds = limits or ServingLimits(), bounds or RequestBounds()
    models = pool_models(server_args)
    resolved = None if models is not None else resolve_frontend_config(engine_args)
    chat_template = load_chat_template(server_args.chat_template)
    sock = _bind_socket(server_args.host, server_args.port)
    lifecycle = ServerLifecycle(server_args.shutdown_timeout)
    server = LifecycleServer(
        uvicorn.Config(
            lifecycle,
            log_level=server_args.uvicorn_log_level,
            lifespan="off",
            timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
        ),
        lifecycle,
    )
    server.loop = asyncio.get_running_loop()
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    served: AsyncLLM | ModelPool | None = None
    try:
        if models is not None:
            start = _engine_starter(server_args, limits, bounds, chat_template)
            guards = functools.partial(add_guards, server_args=server_args, bounds=bounds)
            served = serve_pool(models, engine_args, server_args, limits, lifecycle, start, guards)
            await serving
            return 0
        assert resolved is not None, "no --models-dir nor --model NAME=PATH: one model"
        config = resolved.config
        loggers = StatLoggers.for_config(config, server_args.disable_log_stats)
        served = await _start_engine(resolved, limits, server_args, loggers, serving)
        if served is None:
            return 0
        record_engine(loggers, served)
        lifecycle.serve(build_app(served, server_args, loggers, chat_template, bounds), served)
        watchdog = asyncio.create_task(_exit_when_engine_dies(served, server))
        logger.info(
            "Serving %s at http://%s:%d (OpenAI API under /v1, Ollama API under /api).",
            config.model.served_model_name,
            server_args.host,
            server_args.port,
        )
        await serving
        watchdog.cancel()
    finally:
        server.should_exit = True
        await asyncio.gather(serving, return_exceptions=True)
        if served is not None:
            served.shutdown()
        sock.close()
    return 1 if isinstance(served, AsyncLLM) and served.dead_error is not None else 0


async def _create_engine(
    resolved: FrontendConfig, loggers: StatLoggers, server_args: ServerArgs, limits: ServingLimits
) -> AsyncLLM:
    return await AsyncLLM.create(
        resolved.config,
        loggers.all(),
        server_args.log_requests,
        envs.log_stats_interval_s(),
        limits,
        resolved.tokenizer,
        resolved.engine_process,
    )


def _engine_starter(
    server_args: ServerArgs, limits: ServingLimits, bounds: RequestBounds, chat_template: str | None
) -> EngineStarter:
    """How a pool starts one model: its engine process, then the OpenAI API over it (/metrics included)."""

    async def start(resolved: FrontendConfig) -> tuple[AsyncLLM, ASGIApp]:
        loggers = StatLoggers.for_config(resolved.config, server_args.disable_log_stats)
        engine = await _create_engine(resolved, loggers, server_args, limits)
        try:
            record_engine(loggers, engine)
            return engine, build_app(engine, server_args, loggers, chat_template, bounds)
        except BaseException:
            engine.shutdown()
            raise

    return start


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _refuse_headless_pool(server_args: ServerArgs) -> None:
    """A headless node runs replicas of the head's one model: a pool's models would be ignored."""
    if server_args.named_models or server_args.models_dir is not None:
        flag = "--model NAME=PATH" if server_args.named_models else "--models-dir"
        raise ConfigError(
            f"--headless runs data-parallel replicas of one model for a head node; {flag} serves a pool of "
            f"models, which a headless node cannot: drop {flag} (give the model as --model PATH) or --headless."
        )


def run(args: argparse.Namespace) -> int:
    """Run the server from parsed flags; returns the process exit status."""
    # NOTE: SIGTERM before the server runs (and after) unwinds like Ctrl-C, so no engine process is
    # orphaned; while it runs, LifecycleServer drains on SIGTERM instead.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        engine_args, server_args, limits, bounds = args_from_namespace(args)
        if engine_args.headless:  # this node runs replicas for a head elsewhere: no API server
            _refuse_headless_pool(server_args)
            return run_headless(engine_args.create_engine_config(), limits.engine_stall_timeout)
        return asyncio.run(run_server(engine_args, server_args, limits, bounds))
    except PagedServeError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        logger.info("Stopped.")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pagedserve.entrypoints.openai.api_server",
        description="OpenAI-compatible server for pagedserve (vLLM's flags).",
    )
    return run(make_arg_parser(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
