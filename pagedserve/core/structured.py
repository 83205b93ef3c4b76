"""The scheduler's side of structured outputs and thinking: which requests the step constrains, their
matchers following the sampled tokens, and the step's bitmask (a row per sampled position: the grammar's
allowed tokens, or the end-of-thinking token alone once a thinking budget is spent). The grammars
themselves are in pagedserve/structured_output/, the thinking rule in core/thinking.py."""

from collections.abc import Iterable

import numpy as np

from pagedserve.core.request import Request
from pagedserve.core.thinking import Phase, Row, Thinking, ThinkingState
from pagedserve.structured_output.manager import GrammarBitmask, StructuredOutputManager


class StructuredOutputs:
    """Counts the live constrained requests (a grammar, or a thinking budget) so that a step without any
    pays nothing. With `thinking` (a reasoning parser whose tags are tokens), a grammar applies from the
    end of thinking on, starting from its initial state (vLLM's rule with a reasoning parser)."""

    def __init__(self, manager: StructuredOutputManager | None, thinking: Thinking | None = None) -> None:
        self.manager = manager
        self.thinking = thinking
        self.num_constrained = 0

    def add(self, request: Request) -> None:
        """Start compiling the request's grammar (if it has a constraint); set where its thinking stands."""
        params = request.sampling_params
        if self.thinking is not None:
            request.thinking = self.thinking.initial(request.prompt_token_ids, params.thinking_token_budget)
        if params.structured_outputs is not None:
            assert self.manager is not None, "EngineCore gives the scheduler a StructuredOutputManager"
            request.grammar = self.manager.grammar_for(params.structured_outputs)
        self.num_constrained += self._constrained(request)

    def remove(self, request: Request) -> None:
        self.num_constrained -= self._constrained(request)

    @staticmethod
    def _constrained(request: Request) -> bool:
        thinking = request.thinking
        return request.grammar is not None or (thinking is not None and thinking.budget is not None)

    @staticmethod
    def is_ready(request: Request) -> bool:
        """A request whose grammar is still compiling waits; the others are scheduled meanwhile."""
        return request.grammar is None or request.grammar.ready()

    def bitmask(
        self, requests: Iterable[Request], spec_tokens: dict[str, list[int]]
    ) -> GrammarBitmask | None:
        """The allowed next tokens of the constrained requests that sample this step (those whose
        scheduled tokens, drafts included, reach their end): one row per sampled position, i.e. after
        the output and after each of the request's scheduled drafts `spec_tokens[id]`; a request none
        of whose positions is constrained (thinking within budget) has none. None if no rows."""
        if not self.num_constrained or self.manager is None:
            return None
        plans = []
        for request in requests:
            drafts = spec_tokens.get(request.request_id, [])
            if self._constrained(request) and request.num_computed_tokens == request.num_tokens + len(drafts):
                states = self._states(request, drafts)
                rows = [self._row(request, state) for state in states]
                if any(row is not Row.FREE for row in rows):
                    plans.append((request, drafts, states, rows))
        if not plans:
            return None
        bitmask = self.manager.allocate(sum(len(rows) for *_, rows in plans))
        request_ids: list[str] = []
        for request, drafts, states, rows in plans:
            self._fill(bitmask, len(request_ids), request, drafts, states, rows)
            request_ids += [request.request_id] * len(rows)
        return GrammarBitmask(request_ids, bitmask)

    def _states(self, request: Request, drafts: list[int]) -> list[ThinkingState | None]:
        if self.thinking is None or request.thinking is None:
            return [None] * (1 + len(drafts))
        return list(self.thinking.states(request.thinking, request.num_output_tokens, drafts))

    @staticmethod
    def _row(request: Request, state: ThinkingState | None) -> Row:
        row = Row.GRAMMAR if state is None else Thinking.row(state)
        return Row.FREE if row is Row.GRAMMAR and request.grammar is None else row

    def _fill(
        self,
        bitmask: np.ndarray,
        first: int,
        request: Request,
        drafts: list[int],
        states: list[ThinkingState | None],
        rows: list[Row],
    ) -> None:
        """Rows `first`, ... of `bitmask` (allocated allowing everything) for the request's positions. A
        run of answer positions is its grammar's: from the answer's start in the output when the run is
        the step's first position, else from the grammar's initial state (thinking ended in a draft). An
        output that has not started may open thinking instead: the start tag is allowed there too."""
        position = 0
        while position < len(rows):
            if rows[position] is Row.FORCE_END:
                assert self.thinking is not None
                bitmask[first + position] = 0
                _allow(bitmask[first + position], self.thinking.end_token_id)
            if rows[position] is not Row.GRAMMAR:
                position += 1
                continue
            last = position
            while last + 1 < len(rows) and rows[last + 1] is Row.GRAMMAR:
                last += 1
            state = states[position]
            output = request.output_token_ids
            answer = output[state.answer_start :] if state is not None else output
            assert request.grammar is not None, "an answer position is a grammar row only with a grammar"
            request.grammar.fill_bitmask(
                bitmask, first + position, answer if position == 0 else [], drafts[position:last]
            )
            if state is not None and state.phase is Phase.UNDECIDED:
                assert self.thinking is not None
                # NOTE: the output may still open thinking (Qwen3 writes <think> itself); the grammar waits.
                _allow(bitmask[first + position], self.thinking.start_token_id)
            position = last + 1

    def accept(self, request: Request, token_id: int) -> bool:
        """Follow a sampled token: advance the request's thinking, and its matcher once it answers; True
        when its grammar is complete."""
        if self.thinking is not None and request.thinking is not None:
            index = request.num_output_tokens - 1  # the token is appended already
            request.thinking = self.thinking.after(request.thinking, token_id, index)
            if request.thinking.phase is not Phase.ANSWER or request.thinking.answer_start > index:
                return False  # a thinking token, or the tag that ends thinking
        return request.grammar is not None and request.grammar.accept(token_id)


def _allow(row: np.ndarray, token: int) -> None:
    """Set `token`'s bit in a bitmask row (llguidance's layout: bit t % 32 of int32 word t // 32)."""
    row.view(np.uint32)[token // 32] |= np.uint32(1 << (token % 32))
