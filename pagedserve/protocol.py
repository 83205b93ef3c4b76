"""What crosses the line between the frontend (LLM / API server) and the EngineCore."""
import enum

import msgspec

from pagedserve.sampling_params import SamplingParams


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2

    def __str__(self) -> str:
        return self.name.lower()


class EngineCoreRequestType(bytes, enum.Enum):
    """The first frame of each message to the EngineCore process; the second is the payload."""

    ADD = b"\x00"  # payload: list[EngineCoreRequest]
    ABORT = b"\x01"  # payload: list[str], engine-core request ids
    SHUTDOWN = b"\x02"  # no payload


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """A tokenized, validated request. `max_tokens` is resolved (never None here)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """New tokens of one request since the last step; `finish_reason` set on its last output."""

    request_id: str
    new_token_ids: list[int]
    # Per new token: {token id: logprob}, the sampled token first, then the top-k.
    new_logprobs: list[dict[int, float]] | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SchedulerStats(msgspec.Struct, omit_defaults=True):
    """A snapshot of the engine for logging and metrics."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # fraction of blocks in use
    num_preemptions_total: int = 0  # cumulative: consumers take differences
    num_kv_slots_allocated: int = 0
    num_kv_tokens_stored: int = 0


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True):
    """One step's outputs. `scheduled_request_ids`: requests scheduled for the first time in this step,
    which began at `timestamp` (time.time() in the engine), so the frontend can measure queue time."""

    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    scheduled_request_ids: list[str] = []
