"""What the API server's log says about requests: each one added (its prompt length and parameters), and
the ones lost when the engine dies (with the engine's last known load)."""

from pagedserve.engine.output_processor import RequestState
from pagedserve.errors import EngineDeadError
from pagedserve.logger import init_logger
from pagedserve.protocol import EngineCoreRequest, SchedulerStats
from pagedserve.sampling_params import SamplingParams

logger = init_logger(__name__)

_MAX_LOGGED_REQUESTS = 20  # in-flight requests listed by name when the engine dies


def log_added(request: EngineCoreRequest) -> None:
    logger.info(
        "Added request %s: %d prompt tokens, %s.",
        request.request_id,
        len(request.prompt_token_ids),
        _describe(request.sampling_params)
        if request.pooling_params is None
        else f"pooling ({request.pooling_params.task})",
    )


def log_lost(error: EngineDeadError, states: list[RequestState], stats: SchedulerStats) -> None:
    """The requests in flight that `error` failed, the first ones by name."""
    details = ", ".join(
        f"{s.request_id} ({len(s.prompt_token_ids)} prompt + "
        f"{sum(len(x.token_ids) for x in s.samples)} generated tokens)"
        for s in states[:_MAX_LOGGED_REQUESTS]
    )
    more = f" and {len(states) - _MAX_LOGGED_REQUESTS} more" if len(states) > _MAX_LOGGED_REQUESTS else ""
    logger.error(
        "%s %d request(s) in flight (engine at its last step: %d running, %d waiting, KV cache "
        "%.1f%% used) fail: %s%s.",
        error,
        len(states),
        stats.num_running_reqs,
        stats.num_waiting_reqs,
        stats.kv_cache_usage * 100,
        details or "none",
        more,
    )


def _describe(params: SamplingParams) -> str:
    return (
        f"n={params.n}, max_tokens={params.max_tokens}, temperature={params.temperature}, "
        f"top_p={params.top_p}, seed={params.seed}"
    )
