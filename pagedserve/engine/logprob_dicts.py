"""The engine core's logprobs (`PositionLogprobs`: token ids, values, the chosen token's rank) as vLLM's
`Logprob` dicts, each token with its text: built once, on the frontend, for offline callers and the API
server alike."""

import itertools

from pagedserve.engine.tokenizer import AnyTokenizer
from pagedserve.outputs import Logprob
from pagedserve.protocol import PositionLogprobs


class LogprobDicts:
    def __init__(self, tokenizer: AnyTokenizer) -> None:
        self.tokenizer = tokenizer
        # NOTE: token id -> its text alone. Bounded by the vocabulary; positions repeat the same tokens.
        self._texts: dict[int, str] = {}

    def position(self, entry: PositionLogprobs) -> dict[int, Logprob]:
        """token id -> Logprob: the chosen token first, then the top-k by rank (a top-k token that is the
        chosen one keeps the first place)."""
        ranks = itertools.chain((entry.rank,), itertools.count(1))
        return {
            token_id: Logprob(value, rank, self.text(token_id))
            for token_id, value, rank in zip(entry.token_ids, entry.logprobs, ranks)
        }

    def text(self, token_id: int) -> str:
        """One token's text on its own, as logprobs show it (vLLM's `decoded_token`)."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = str(self.tokenizer.decode([token_id]))
        return text
