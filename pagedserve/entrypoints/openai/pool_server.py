"""A server of several models (--models-dir, --model NAME=PATH): the pool built from the flags, its
routes in front of the models' apps, and how it loads one model (the engine flags with the model's path
and name, in an engine process of its own). api_server.py starts one engine and its app; this wires many."""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace

from fastapi import FastAPI
from starlette.types import ASGIApp

from pagedserve.config import EngineArgs
from pagedserve.config.frontend_config import FrontendConfig, resolve_frontend_config
from pagedserve.engine.admission import ServingLimits
from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.entrypoints.openai.cli_args import ServerArgs
from pagedserve.entrypoints.openai.lifecycle import ServerLifecycle
from pagedserve.entrypoints.openai.model_pool import LoadedModel, LoadWaits, ModelLoader, ModelPool
from pagedserve.entrypoints.openai.models_dir import ModelFile, served_models
from pagedserve.entrypoints.openai.pool_app import PoolApp, build_pool_info_app
from pagedserve.logger import init_logger
from pagedserve.sizing import CPU_DEFAULT_KV_BYTES

logger = init_logger(__name__)

# Starts one model's engine from its config and builds the API app over it (api_server's).
EngineStarter = Callable[[FrontendConfig], Awaitable[tuple[AsyncLLM, ASGIApp]]]
AppGuards = Callable[[FastAPI], None]  # the body-size limit, the API key and CORS (api_server.add_guards)


def pool_models(server_args: ServerArgs) -> dict[str, ModelFile] | None:
    """The models to serve by name, None when neither --models-dir nor --model NAME=PATH is given (one
    model). Raises ConfigError."""
    if server_args.models_dir is None and not server_args.named_models:
        return None
    return served_models(server_args.models_dir, list(server_args.named_models))


def serve_pool(
    models: dict[str, ModelFile],
    engine_args: EngineArgs,
    server_args: ServerArgs,
    limits: ServingLimits,
    lifecycle: ServerLifecycle,
    start: EngineStarter,
    guards: AppGuards,
) -> ModelPool:
    """Serve `models` (none loaded yet) through `lifecycle`."""
    waits = LoadWaits(_load_queue_limit(limits, engine_args.max_num_seqs), limits.max_queue_time)
    pool = ModelPool(
        models,
        server_args.residency_limits(),
        server_args.keep_alive_s(),
        _model_loader(engine_args, start),
        waits,
        resident_bytes_beside_weights(engine_args),
    )
    app = build_pool_info_app(pool)
    guards(app)
    app.mount("/", PoolApp(pool))
    lifecycle.serve(app, pool)
    logger.info(
        "Serving %d models (%s) at http://%s:%d, each loaded when first asked for.",
        len(models),
        ", ".join(models),
        server_args.host,
        server_args.port,
    )
    return pool


def resident_bytes_beside_weights(engine_args: EngineArgs) -> int:
    """What each loaded model holds beside its weights, as its engine flags size it: its KV cache
    (--kv-cache-memory, else the most the CPU's default takes) and the host swap of each of its workers
    (--swap-space). The memory budget (--max-loaded-memory) counts it with the weights."""
    kv_bytes = engine_args.kv_cache_bytes() or CPU_DEFAULT_KV_BYTES
    workers = engine_args.tensor_parallel_size * engine_args.pipeline_parallel_size
    return kv_bytes + int(engine_args.swap_space * 2**30) * workers


def _load_queue_limit(limits: ServingLimits, max_num_seqs: int) -> int:
    """How many requests may wait for one model's load: --max-num-queued-requests (-1: no limit, 0 here),
    by default twice what its engine will run at once, as for the engine's own queue."""
    if limits.max_num_queued_requests is None:
        return 2 * max_num_seqs
    return max(limits.max_num_queued_requests, 0)


def _model_loader(engine_args: EngineArgs, start: EngineStarter) -> ModelLoader:
    async def load(model: ModelFile) -> LoadedModel:
        settings = replace(engine_args, model=model.path, served_model_name=model.name)
        # NOTE: in a thread: resolving the settings (a child process; a GGUF's first conversion: seconds)
        # must not stall the other models' requests and the pool's listings.
        engine, app = await start(await asyncio.to_thread(resolve_frontend_config, settings))
        return LoadedModel(model.name, engine, app)

    return load
