"""What the scheduler tells the workers each step, and what they answer. No tensors here."""

from dataclasses import dataclass, field

from pagedserve.protocol import ImageInput, LoRARequest, PoolingParams, PositionLogprobs
from pagedserve.sampling_params import SamplingParams
from pagedserve.structured_output.manager import GrammarBitmask


@dataclass(slots=True)
class NewRequestData:
    """A request the workers have not seen (or must rebuild after preemption): sent in full."""

    request_id: str
    token_ids: list[int]  # every token known now: prompt plus outputs of a resumed request
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_id: int | None
    block_ids: list[int]
    num_computed_tokens: int
    pooling_params: PoolingParams | None = None  # --runner pooling: pool the prompt, sample nothing
    lora_request: LoRARequest | None = None  # --enable-lora: its adapter
    beam: bool = False  # a beam of a beam search: it reports HF's beam scores as its logprobs
    images: list[ImageInput] | None = None  # an image model's prompt images (the encoder's inputs)


@dataclass(slots=True)
class CachedRequestData:
    """A request the workers already hold: only what changed."""

    request_id: str
    new_token_ids: list[int]  # tokens sampled since the workers last saw this request
    new_tokens_start: int  # the position of new_token_ids[0]: how many tokens the workers hold of it
    new_block_ids: list[int]
    num_computed_tokens: int
    # Blocks released from the end of the table since the last step (they held only rejected draft
    # tokens): dropped before new_block_ids are appended.
    num_dropped_blocks: int = 0


BlockPairs = list[tuple[int, int]]  # (source block id, destination block id)


@dataclass
class SchedulerOutput:
    """One step's plan. Requests are computed in the order new, then cached. Before the forward the
    workers move K/V blocks, in every layer, in this order: swap out (device -> host blocks), swap in
    (host -> device), copy (device -> device, copy-on-write). A step may move blocks and compute
    nothing."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Requests the workers must forget: finished, aborted or preempted since the last step.
    finished_req_ids: set[str] = field(default_factory=set)
    blocks_to_swap_out: BlockPairs = field(default_factory=list)
    blocks_to_swap_in: BlockPairs = field(default_factory=list)
    blocks_to_copy: BlockPairs = field(default_factory=list)
    # Speculative decoding: request id -> the draft tokens scheduled after its last token. They are
    # computed with it; the workers return the accepted ones and the token after them.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # The allowed next tokens of the constrained requests that sample this step (None: none does).
    grammar_bitmask: GrammarBitmask | None = None
    # The frontend's ids of the requests started for the first time (not resumed after a preemption):
    # they leave the frontend's queue now. The workers ignore it.
    first_scheduled_req_ids: list[str] = field(default_factory=list)

    @property
    def has_block_ops(self) -> bool:
        return bool(self.blocks_to_swap_out or self.blocks_to_swap_in or self.blocks_to_copy)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    """Sampled tokens of the requests whose scheduled tokens reached their end this step."""

    sampled_token_ids: dict[str, int]
    # Speculative decoding: request id -> the further tokens of this step after sampled_token_ids[id]
    # (accepted drafts, then the token sampled after them).
    extra_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # Speculative decoding with a draft model: request id -> the tokens it proposes for the next step.
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # request id -> the sampled token's logprobs (it asked for logprobs).
    logprobs: dict[str, PositionLogprobs] = field(default_factory=dict)
    # request id -> logprobs of the prompt positions computed this step (first position: None).
    prompt_logprobs: dict[str, list[PositionLogprobs | None]] = field(default_factory=dict)
    # --runner pooling: request id -> its pooled vector (embedding or scores).
    pooled: dict[str, list[float]] = field(default_factory=dict)
    # An image model: the encoder's cumulative (images encoded, seconds), for the metrics.
    encoder_totals: tuple[int, float] | None = None
    # request id -> why the worker could not run it (its LoRA adapter's files): it ends with that error.
    failed: dict[str, str] = field(default_factory=dict)
