"""The scheduler's side of structured outputs: which requests the step constrains, and their matchers
following the sampled tokens. The grammars themselves are in pagedserve/structured_output/."""

from collections.abc import Iterable

from pagedserve.core.request import Request
from pagedserve.structured_output.manager import GrammarBitmask, StructuredOutputManager


class StructuredOutputs:
    """Counts the live constrained requests so that a step without any pays nothing."""

    def __init__(self, manager: StructuredOutputManager | None) -> None:
        self.manager = manager
        self.num_constrained = 0

    def add(self, request: Request) -> None:
        """Start compiling the request's grammar (if it has a constraint)."""
        params = request.sampling_params.structured_outputs
        if params is None:
            return
        assert self.manager is not None, "EngineCore gives the scheduler a StructuredOutputManager"
        request.grammar = self.manager.grammar_for(params)
        self.num_constrained += 1

    def remove(self, request: Request) -> None:
        if request.grammar is not None:
            self.num_constrained -= 1

    @staticmethod
    def is_ready(request: Request) -> bool:
        """A request whose grammar is still compiling waits; the others are scheduled meanwhile."""
        return request.grammar is None or request.grammar.ready()

    def bitmask(
        self, requests: Iterable[Request], spec_tokens: dict[str, list[int]]
    ) -> GrammarBitmask | None:
        """The allowed next tokens of the constrained requests that sample this step (those whose
        scheduled tokens, drafts included, reach their end): one row per sampled position, i.e. after
        the output and after each of the request's scheduled drafts `spec_tokens[id]`. None if none."""
        if not self.num_constrained or self.manager is None:
            return None
        rows = [
            (r.request_id, r.grammar, r.output_token_ids, drafts)
            for r in requests
            if r.grammar is not None
            and r.num_computed_tokens == r.num_tokens + len(drafts := spec_tokens.get(r.request_id, []))
        ]
        return self.manager.bitmask(rows) if rows else None

    @staticmethod
    def accept(request: Request, token_id: int) -> bool:
        """Advance the request's matcher; True when its grammar is complete."""
        return request.grammar is not None and request.grammar.accept(token_id)
