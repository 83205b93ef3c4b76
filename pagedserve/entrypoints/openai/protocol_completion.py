"""The OpenAI API's completions bodies (/v1/completions, pydantic): the request, with vLLM's echo-only
scoring and beam search fields, and the response with its logprobs. Unknown fields, strict booleans and
ranges as in protocol.py."""

import time
from typing import Literal

from pydantic import Field, StrictBool

from pagedserve.entrypoints.openai.protocol import PromptLogprobs, SamplingRequest, UsageInfo
from pagedserve.entrypoints.openai.request_fields import OpenAIBaseModel
from pagedserve.errors import InvalidRequestError
from pagedserve.sampling_params import BeamSearchParams


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: StrictBool = False
    best_of: int | None = None
    suffix: str | None = None
    # vLLM's beam search fields: a search of width best_of (default n) returning the n best beams.
    use_beam_search: StrictBool = False
    length_penalty: float = 1.0
    early_stopping: StrictBool | Literal["never"] = False  # HF's values

    def echo_only(self) -> bool:
        """echo with max_tokens 0 (vLLM's prompt scoring): the prompt and its logprobs, nothing generated."""
        return self.echo and self.max_tokens == 0

    def num_prompt_logprobs(self) -> int | None:
        """prompt_logprobs, or (echo with logprobs) the echoed prompt's logprobs: the larger."""
        echoed = self.logprobs if self.echo else None
        asked = [n for n in (self.prompt_logprobs, echoed) if n is not None]
        return max(asked) if asked else None

    def check_supported(self) -> None:
        self.check_stream_options()
        if self.suffix:
            raise InvalidRequestError("suffix is not supported.", param="suffix")
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError(
                "max_tokens must be at least 1, got 0 (0 only with echo: the prompt back, scored with "
                "logprobs, nothing generated).",
                param="max_tokens",
            )
        if self.best_of is not None and self.best_of < self.n:
            raise InvalidRequestError(f"best_of={self.best_of} must be at least n={self.n}.", param="best_of")
        if self.stream and (self.use_beam_search or (self.best_of or self.n) > self.n):
            raise InvalidRequestError(
                "best_of > n and use_beam_search cannot be streamed: their outputs "
                "are known only at the end; set stream to false.",
                param="stream",
            )

    def beam_search_params(self) -> BeamSearchParams | None:
        """The beam search asked for (use_beam_search), else None. Raises InvalidRequestError."""
        if not self.use_beam_search:
            return None
        if self.max_tokens is None:
            raise InvalidRequestError("use_beam_search needs max_tokens.", param="max_tokens")
        return BeamSearchParams(
            beam_width=self.best_of or self.n,
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
        )


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
