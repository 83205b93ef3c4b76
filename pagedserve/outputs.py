"""What `LLM.generate` returns: vLLM's RequestOutput / CompletionOutput."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class Logprob:
    """One token's logprob at a position (vLLM's `Logprob`): its rank in the vocabulary (1: the most
    likely) and its text on its own."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (the sampled token first, then the top-k).
SampleLogprobs = list[dict[int, Logprob]]
# Per prompt position, the same for the prompt's token there (the first position has none: None).
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    """One generated sequence of a request."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """All outputs of one request, as the engine last produced them."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # why the engine could not run it (its samples' finish_reason: "error")
    pooled: list[float] | None = None  # --runner pooling: the prompt's embedding or scores
    num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache (None: not known yet)


@dataclass
class BeamSearchSequence:
    """One final beam of `LLM.beam_search` (vLLM's layout): `tokens` holds the prompt's and the generated
    token ids, `text` their decoded text."""

    tokens: list[int]
    text: str
    cum_logprob: float
    finish_reason: str | None = None  # "stop" (EOS) | "length"


@dataclass
class BeamSearchOutput:
    """The best beams of one prompt, best first (by cumulative logprob / length ** length_penalty)."""

    sequences: list[BeamSearchSequence]


@dataclass
class PoolingRequestOutput:
    """What `LLM.encode` / `embed` / `classify` return per prompt (vLLM's layout): `outputs.data` is the
    embedding or the class probabilities."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: "PoolingOutput"
    finished: bool = True


@dataclass
class PoolingOutput:
    data: list[float]

    @property
    def embedding(self) -> list[float]:
        return self.data

    @property
    def probs(self) -> list[float]:
        return self.data


@dataclass
class ScoringRequestOutput:
    """`LLM.score`: one per (query, document) pair (vLLM's layout): `outputs.score` is the cosine of their
    embeddings or the cross-encoder's score; `prompt_token_ids` the pair's tokens (an embedding model's:
    the query's, then the document's)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: "ScoringOutput"
    finished: bool = True


@dataclass
class ScoringOutput:
    score: float
