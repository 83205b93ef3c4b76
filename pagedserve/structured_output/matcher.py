"""One request's grammar state: an llguidance matcher that follows the request's output tokens."""

from concurrent.futures import Future

import llguidance
import llguidance.numpy
import numpy as np

from pagedserve.logger import init_logger

logger = init_logger(__name__)


class RequestGrammar:
    """Created when the request arrives, with the (maybe still compiling) grammar; usable once `ready()`.
    The matcher has consumed exactly the tokens it was told about: `fill_bitmask` first brings it in line
    with the request's output tokens (rolling back or replaying), so its state always follows the tokens,
    whatever preemption or recompute did."""

    def __init__(self, compiled: "Future[llguidance.LLMatcher]") -> None:
        self._compiled = compiled
        self._matcher: llguidance.LLMatcher | None = None
        self._accepted: list[int] = []

    def ready(self) -> bool:
        """Whether the grammar is compiled (the scheduler keeps the request waiting until then)."""
        if self._matcher is None and self._compiled.done():
            self._matcher = self._compiled.result().deep_copy()  # the cached template stays fresh
        return self._matcher is not None

    @property
    def matcher(self) -> llguidance.LLMatcher:
        if self._matcher is None:
            # NOTE: the scheduler admits a request only once ready(); a sample forked from its group's leader
            # skips that check, but shares the leader's (compiled) grammar, so this does not wait.
            self._matcher = self._compiled.result().deep_copy()
        return self._matcher

    def fill_bitmask(self, bitmask: np.ndarray, row: int, output_token_ids: list[int]) -> None:
        """The tokens allowed next, as bits of `bitmask[row]`."""
        self._sync(output_token_ids)
        llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask, row)

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token; True once the grammar is complete (the request should stop)."""
        matcher = self.matcher
        if not matcher.consume_token(token_id):
            logger.warning("Grammar rejected sampled token %d: %s", token_id, matcher.get_error())
        self._accepted.append(token_id)
        return matcher.is_stopped() or matcher.is_error()

    def _sync(self, output_token_ids: list[int]) -> None:
        accepted = self._accepted
        if len(accepted) == len(output_token_ids):
            return  # the usual case: nothing happened to the tokens since the last accept
        common = 0
        while (
            common < min(len(accepted), len(output_token_ids))
            and accepted[common] == output_token_ids[common]
        ):
            common += 1
        matcher = self.matcher
        if common < len(accepted):
            matcher.rollback(len(accepted) - common)
        matcher.consume_tokens(output_token_ids[common:])
        self._accepted = list(output_token_ids)
