"""One request's grammar state: an llguidance matcher that follows the request's output tokens."""

from collections.abc import Sequence
from concurrent.futures import Future

import llguidance
import llguidance.numpy
import numpy as np

from pagedserve.logger import init_logger

logger = init_logger(__name__)


def _allows(words: np.ndarray, token: int) -> bool:
    """Whether a bitmask row (int32 words, token t at bit t % 32 of word t // 32) allows `token`."""
    return token < 32 * len(words) and bool((int(words[token // 32]) >> (token % 32)) & 1)


# llguidance's terse stop reasons, said plainly.
_ERROR_MEANINGS = {"NoExtensionBias": "no token may follow, and the output does not complete it"}


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

    def fill_bitmask(
        self, bitmask: np.ndarray, row: int, output_token_ids: list[int], drafts: Sequence[int] = ()
    ) -> None:
        """The tokens allowed next, as bits of `bitmask[row]`, and with draft tokens (speculative decoding)
        those allowed after each draft, in the rows after it. The matcher rolls forward through the drafts
        and back (vLLM's way). Rows after a draft the grammar forbids allow everything: verification
        rejects that draft (its row's mask excludes it), so they are never sampled from."""
        self._sync(output_token_ids)
        matcher = self.matcher
        llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, row)
        num_consumed = 0
        for token in drafts:
            if not _allows(bitmask[row + num_consumed], token) or not matcher.consume_token(token):
                bitmask[row + num_consumed + 1 : row + len(drafts) + 1] = -1
                break
            num_consumed += 1
            llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, row + num_consumed)
        if num_consumed:
            matcher.rollback(num_consumed)

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token; True once the grammar ended: complete (the request stops), or
        failed (`failure` says why: the request must not pass for one that completed)."""
        matcher = self.matcher
        matcher.consume_token(token_id)
        self._accepted.append(token_id)
        if matcher.is_error():
            logger.warning(
                "Grammar failed after %d output tokens (the last %d): %s",
                len(self._accepted),
                token_id,
                matcher.get_error(),
            )
            return True
        return matcher.is_stopped()

    @property
    def failure(self) -> str | None:
        """Why the grammar dead-ended, or None. It does when no token may follow while it is incomplete
        (llguidance then allows only EOS), when a sampled token breaks it, or when it failed to compile or
        ran out of fuel; llguidance's matcher then stays in its error state."""
        if self._matcher is None or not self._matcher.is_error():
            return None
        # NOTE: the first line is the error; the rest is the parser's state dump (for the log).
        error = self._matcher.get_error().split("\n", 1)[0]
        return f"grammar failed: {_ERROR_MEANINGS.get(error, error)}"

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
