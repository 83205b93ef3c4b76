"""Where a thinking model's output stops thinking (--reasoning-parser), followed token by token in the
scheduler, and what that means for each sampled position: free while thinking, the end-of-thinking token
forced once the thinking budget is spent, the grammar's (structured outputs, tool calls) from the first
answer token on. The same rule as the text parsers (pagedserve/reasoning/parser.py), on token ids."""

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedserve.config.reasoning import ReasoningConfig


class Phase(enum.Enum):
    UNDECIDED = enum.auto()  # nothing sampled yet, not thinking: a start tag first would open thinking
    THINKING = enum.auto()
    ANSWER = enum.auto()


class Row(enum.Enum):
    """What constrains one sampled position."""

    FREE = enum.auto()  # thinking within budget (or an unconstrained answer)
    FORCE_END = enum.auto()  # the budget is spent: only the end-of-thinking token
    GRAMMAR = enum.auto()  # the answer: the request's grammar, if any (undecided counts as answer)


@dataclass(frozen=True)
class ThinkingState:
    """Frozen: a forked beam shares it until either advances (each then holds its own)."""

    phase: Phase
    budget: int | None  # thinking tokens allowed (None: no limit)
    num_thinking_tokens: int = 0  # the output's tokens inside thinking (tags excluded)
    answer_start: int = 0  # the output index of the answer's first token (where the grammar starts)


class Thinking:
    """Needs the parser's tags as single tokens (`ReasoningConfig.tracks_thinking`)."""

    def __init__(self, config: ReasoningConfig) -> None:
        assert config.think_start_token_id is not None and config.think_end_token_id is not None
        self.start_token_id = config.think_start_token_id
        self.end_token_id = config.think_end_token_id
        self.thinks_by_default = config.thinks_by_default
        self.default_budget = config.default_thinking_token_budget

    def initial(self, prompt_token_ids: Sequence[int], budget: int | None) -> ThinkingState:
        """The state before the first output token: thinking when the prompt's last tag opened a block
        (or it has none and the parser's models think by default), answering when it closed one
        (enable_thinking false), else undecided."""
        budget = self.default_budget if budget is None else budget
        for token in reversed(prompt_token_ids):
            if token == self.start_token_id:
                return ThinkingState(Phase.THINKING, budget)
            if token == self.end_token_id:
                return ThinkingState(Phase.ANSWER, budget)
        return ThinkingState(Phase.THINKING if self.thinks_by_default else Phase.UNDECIDED, budget)

    def after(self, state: ThinkingState, token: int, index: int) -> ThinkingState:
        """The state once `token` is the output's token number `index`."""
        if state.phase is Phase.ANSWER:
            return state
        if state.phase is Phase.UNDECIDED:
            if token == self.start_token_id:
                return replace(state, phase=Phase.THINKING)
            return replace(state, phase=Phase.ANSWER, answer_start=index)
        if token == self.end_token_id:
            return replace(state, phase=Phase.ANSWER, answer_start=index + 1)
        if token == self.start_token_id and index == 0:
            return state  # the tag of a block the prompt opened already
        return replace(state, num_thinking_tokens=state.num_thinking_tokens + 1)

    @staticmethod
    def row(state: ThinkingState) -> Row:
        if state.phase is not Phase.THINKING:
            return Row.GRAMMAR
        if state.budget is not None and state.num_thinking_tokens >= state.budget:
            return Row.FORCE_END
        return Row.FREE

    def states(self, state: ThinkingState, first_index: int, drafts: Sequence[int]) -> list[ThinkingState]:
        """The state at each sampled position of a step: after the output, then after each draft."""
        states = [state]
        for offset, token in enumerate(drafts):
            states.append(self.after(states[-1], token, first_index + offset))
        return states
