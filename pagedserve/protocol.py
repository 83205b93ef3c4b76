"""What crosses the line between the frontend (LLM / API server) and the EngineCore."""

import enum

import msgspec

from pagedserve.sampling_params import BeamSearchParams, SamplingParams


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    # The request failed. With EngineCoreOutput.error: the engine could not take it (its input failed to
    # decode or to be admitted), the caller gets that error. Without: it ran and could not go on (its
    # grammar dead-ended), its output so far is returned with `stop_reason` saying why. Clients see
    # finish_reason "error", one of vLLM v1's finish reasons too (FINISH_REASON_STRINGS).
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


class EngineCoreRequestType(bytes, enum.Enum):
    """The first frame of each message to the EngineCore process; the second is the payload."""

    ADD = b"\x00"  # payload: list[EngineCoreRequest]
    ABORT = b"\x01"  # payload: list[str], engine-core request ids
    SHUTDOWN = b"\x02"  # no payload
    BLOCK_SNAPSHOT = b"\x04"  # no payload; answered by an EngineCoreOutputs carrying `block_snapshot`
    RESET_PREFIX_CACHE = b"\x03"  # no payload
    SLEEP = b"\x05"  # payload: the level (1 or 2) as msgpack; answered by an output carrying `sleep_level`
    WAKE_UP = b"\x06"  # no payload; answered by an output carrying `sleep_level` 0


class PoolingParams(msgspec.Struct, array_like=True, omit_defaults=True):
    """A pooling runner's request (--runner pooling): what its prompt's hidden states become, resolved by
    the frontend (engine/pooling_input.py) so the workers only apply it. `task`: embed (a vector) or
    classify (the head's scores); `dimensions`: keep the first d values (Matryoshka), before `normalize`;
    `activation`: softmax over the labels (sigmoid for one); `token_type_start`: the second segment of a
    cross-encoder's pair starts here (BERT's token_type_ids are 1 from it on)."""

    task: str = "embed"
    dimensions: int | None = None
    normalize: bool = False
    activation: bool = False
    token_type_start: int | None = None


class LoRARequest(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """A PEFT adapter folder (`lora_path`: adapter_config.json + adapter_model.safetensors or .bin) served as
    `lora_name`. `lora_int_id` (>= 1) and `files_digest` identify these weights everywhere in the engine
    (`identity`): the workers' slots and host copies, the prefix cache (an adapter's KV differs from the base
    model's). `files_digest` is set by the frontend, the sha256 of the files it read (lora/peft.py); a worker
    reading the files again refuses the request when they no longer match. Give a new id to new weights."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None
    files_digest: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int):
            raise ValueError(f"lora_int_id must be an integer, got {self.lora_int_id!r}.")
        if not 1 <= self.lora_int_id < 2**63:
            raise ValueError(f"lora_int_id must be in [1, 2**63), got {self.lora_int_id}.")
        if not self.lora_name or not self.lora_path:
            raise ValueError("a LoRARequest needs a lora_name and a lora_path (the adapter's folder).")

    @property
    def identity(self) -> bytes:
        """What the engine's caches key this adapter by: its id and its files' digest."""
        return self.lora_int_id.to_bytes(8, "little") + self.files_digest.encode()

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path


class ImageInput(msgspec.Struct, array_like=True, frozen=True):
    """One image of a prompt, processed by the model's own HF processor in the frontend: its pixel values
    (float32, C-contiguous bytes of `shape`), the `length` placeholder tokens from prompt position `offset`
    that its embeddings replace, and `content_hash` (sha256 of shape, size and pixels), which keys the
    workers' encoder cache and enters the prefix-cache hashes of the blocks holding its tokens.
    `image_size`: the image's size before the processor, for models whose tokens depend on it (LLaVA-NeXT's
    unpadding)."""

    content_hash: str
    offset: int
    length: int
    shape: list[int]
    pixel_values: bytes
    image_size: list[int] | None = None  # [height, width] before the processor, for any-res tiles


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """A tokenized, validated request. `max_tokens` is resolved (never None here).

    `cache_salt`: prefix-cache hits only between requests with the same salt (tenants).
    `group_id`: the frontend request this is one sample of (n / best_of > 1); samples of one group
    share the prompt's KV blocks. `beam_search`: run a beam search; its `sampling_params.n` best
    beams come back as the outputs of `child_request_id(request_id, i, n)`."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    cache_salt: str | None = None
    group_id: str | None = None
    beam_search: BeamSearchParams | None = None
    # --scheduling-policy priority: lower values are admitted first and preempted last (vLLM's rule).
    priority: int = 0
    # --runner pooling: the request is pooled, not sampled (its sampling_params are a placeholder).
    pooling_params: PoolingParams | None = None
    # --enable-lora: the adapter over the base model (None: the base model).
    lora_request: LoRARequest | None = None
    # An image model's prompt images, in prompt order (None: text only).
    images: list[ImageInput] | None = None
    # The frontend wants the tokens only at the end: an output for the first token (its time) and one when
    # the request finishes, with every token since (a final-only request without stop strings or logprobs
    # of an engine that measures nothing per token, `OutputProcessor(measures=False)`).
    final_only: bool = False


class PositionLogprobs(msgspec.Struct, array_like=True):
    """The logprobs of one position: the chosen token's (sampled, or the prompt's next) first, then the
    top-k, largest first; `rank`: the chosen token's rank in the vocabulary (1: the most likely; tokens
    as likely count ahead of it, as vLLM counts). The frontend turns them into vLLM's `Logprob` dicts."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """New tokens of one request since its last output; `finish_reason` set on its last output."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[PositionLogprobs] | None = None  # per new token
    prompt_logprobs: list[PositionLogprobs | None] | None = None  # per prompt position (the first: None)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None  # set on the final outputs of a beam search
    # Prompt tokens found in the prefix cache when the request was first admitted: on its first output
    # of generated tokens.
    num_cached_tokens: int | None = None
    error: str | None = None  # with FinishReason.ERROR: what went wrong, for the request's caller
    pooled: list[float] | None = None  # --runner pooling: the request's embedding or scores

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SchedulerStats(msgspec.Struct, omit_defaults=True):
    """A snapshot of the engine for logging and metrics."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # fraction of blocks in use
    num_preemptions_total: int = 0  # cumulative: consumers take differences
    num_recomputed_tokens_total: int = 0  # cumulative: computed tokens whose KV preemptions dropped
    num_priority_preemptions: int = 0  # cumulative: those for a more urgent waiting request (priority)
    # Slots of the blocks in the requests' block tables (a shared block counts once per holder), and
    # the tokens the running requests have computed: the difference is paging's waste.
    num_kv_slots_allocated: int = 0
    num_kv_tokens_stored: int = 0
    num_shared_blocks: int = 0  # blocks held by more than one request
    num_blocks_saved: int = 0  # blocks the holders would need on top if nothing were shared
    num_swapped_reqs: int = 0
    # Prefix cache, cumulative (consumers take differences): prompt tokens looked up, and found.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Speculative decoding, cumulative: verification steps with drafts, draft tokens, accepted drafts.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    # An image model, cumulative: images the encoder ran on, and its seconds.
    num_images_encoded: int = 0
    encoder_seconds: float = 0.0
    # --enable-lora: the names of the adapters of the running and of the waiting requests.
    running_lora_adapters: list[str] = msgspec.field(default_factory=list)
    waiting_lora_adapters: list[str] = msgspec.field(default_factory=list)


def child_request_id(request_id: str, index: int, n: int) -> str:
    """The engine-core id of sample `index` of a request with `n` samples (or of its index-th best
    beam): the request's own id when there is only one."""
    return request_id if n == 1 else f"{index}_{request_id}"


class BlockSnapshot(msgspec.Struct, array_like=True):
    """The KV block pool at one moment (engine/block_state.py), for the dashboard. `cells`: one per
    `blocks_per_cell` usable blocks: 0 free, -1 free but holding a revivable cached prefix, -2 shared
    by several requests, k >= 1 held by `request_ids[k - 1]` alone."""

    num_blocks: int  # usable (the reserved null block left out)
    block_size: int
    blocks_per_cell: int
    cells: list[int]
    request_ids: list[str]
    num_free_blocks: int  # cached ones included: they are evicted on demand
    num_cached_blocks: int
    num_shared_blocks: int
    num_host_blocks: int = 0  # the swap space (--swap-space): blocks in all, and free ones
    num_free_host_blocks: int = 0


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True):
    """One step's outputs. `scheduled_request_ids`: requests scheduled for the first time in this step,
    which began at `timestamp` (time.time() in the engine), so the frontend can measure queue time."""

    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    scheduled_request_ids: list[str] = []
    block_snapshot: BlockSnapshot | None = None  # only in the answer to BLOCK_SNAPSHOT
    num_scheduled_tokens: int = 0  # tokens the step computed (vllm:iteration_tokens_total)
    engine_index: int = 0  # --data-parallel-size: the replica it came from (set by the frontend's client)
    sleep_level: int | None = None  # only in the answer to SLEEP and WAKE_UP: the level now (0: awake)
