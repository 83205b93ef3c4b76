"""The frontend's check of a request's structured_outputs, so a bad schema or grammar is a 400 (a too
large one a 413) before anything reaches the engine."""

import llguidance

from pagedserve.engine.tokenizer import AnyTokenizer
from pagedserve.errors import InvalidRequestError
from pagedserve.sampling_params import BeamSearchParams, SamplingParams
from pagedserve.structured_output.grammar import DEFAULT_MAX_SPEC_BYTES, make_ll_tokenizer, validate


class StructuredOutputValidator:
    """Builds llguidance's tokenizer on the first constrained request (about a second, once)."""

    def __init__(
        self,
        tokenizer: AnyTokenizer,
        vocab_size: int,
        max_spec_bytes: int = DEFAULT_MAX_SPEC_BYTES,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_spec_bytes = max_spec_bytes
        self._ll_tokenizer: llguidance.LLTokenizer | None = None

    def validate(self, params: SamplingParams, beam_search: BeamSearchParams | None) -> None:
        constraint = params.structured_outputs
        if constraint is None:
            return
        if beam_search is not None:
            raise InvalidRequestError(
                "structured_outputs cannot be combined with beam search: drop one.",
                param="structured_outputs",
            )
        if self._ll_tokenizer is None:
            self._ll_tokenizer = make_ll_tokenizer(self.tokenizer, self.vocab_size)
        validate(constraint, self._ll_tokenizer, self.max_spec_bytes)
