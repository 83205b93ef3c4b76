"""Grammar compiles off the step's path, cached by constraint; the step's bitmask for the requests that
sample. Lives with the scheduler (in the engine core process), as vLLM v1's StructuredOutputManager:
the matchers advance where the sampled tokens arrive, and the workers get one numpy bitmask per step."""

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llguidance
import llguidance.numpy
import numpy as np

from pagedserve.logger import init_logger
from pagedserve.structured_output.grammar import PARSER_LIMITS, make_ll_tokenizer, to_grammar
from pagedserve.structured_output.matcher import RequestGrammar
from pagedserve.structured_outputs_params import StructuredOutputsParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = init_logger(__name__)

_MAX_CACHED_GRAMMARS = 256


@dataclass
class GrammarBitmask:
    """Row i: the tokens `request_ids[i]` may sample at its next position, one bit per token (llguidance's
    layout: token t is bit t % 32 of int32 word t // 32). A request with draft tokens has one row per
    verified position, in order."""

    request_ids: list[str]
    bitmask: np.ndarray  # [rows, ceil(vocab / 32)] int32


class StructuredOutputManager:
    """`load_tokenizer` builds the HF tokenizer on the first compile (in the compile thread: an engine
    without constrained requests never pays for it)."""

    def __init__(
        self, load_tokenizer: Callable[[], "PreTrainedTokenizerBase"], vocab_size: int, num_threads: int = 1
    ) -> None:
        self._load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        # NOTE: llguidance drops the GIL while it compiles: the engine keeps stepping meanwhile.
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="grammar-compile")
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._tokenizer_lock = threading.Lock()
        self._compiled: OrderedDict[tuple[str, str], Future[llguidance.LLMatcher]] = OrderedDict()
        self.num_compiles = 0

    def grammar_for(self, params: StructuredOutputsParams) -> RequestGrammar:
        """A new request's grammar state; its compile starts now unless the same constraint is cached."""
        key = (params.kind, params.spec)
        compiled = self._compiled.get(key)
        if compiled is None or (compiled.done() and compiled.exception() is not None):
            compiled = self._compiled[key] = self._pool.submit(self._compile, params)
            self.num_compiles += 1
            if len(self._compiled) > _MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        return RequestGrammar(compiled)

    def _compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        tokenizer = self._get_tokenizer()
        matcher = llguidance.LLMatcher(tokenizer, to_grammar(params), limits=PARSER_LIMITS)
        if matcher.is_error():
            # NOTE: the frontend validated this constraint with the same limits, so this is rare; an
            # errored matcher allows only EOS: the request ends at once instead of running unconstrained.
            logger.warning(
                "Grammar for a %s constraint failed to compile: %s", params.kind, matcher.get_error()
            )
        # The first mask builds the lexer: do it here, not in a step.
        llguidance.numpy.fill_next_token_bitmask(matcher, self.allocate(1))
        return matcher

    def _get_tokenizer(self) -> llguidance.LLTokenizer:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = make_ll_tokenizer(self._load_tokenizer(), self.vocab_size)
            return self._tokenizer

    def allocate(self, rows: int) -> np.ndarray:
        """A bitmask of `rows` rows that allow every token."""
        return llguidance.numpy.allocate_token_bitmask(rows, self.vocab_size)

    def wait_for_compile(self, timeout_s: float) -> None:
        """Block until a pending compile ends (or `timeout_s`): for an engine with nothing else to run,
        rather than spinning on empty steps against the compile thread."""
        pending = [future for future in self._compiled.values() if not future.done()]
        if pending:
            wait(pending, timeout_s, return_when=FIRST_COMPLETED)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
