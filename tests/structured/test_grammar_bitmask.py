"""The worker's bitmask application against a plain reference, and the matcher following a request's
tokens through a rollback (what a preemption that dropped tokens would need)."""

import numpy as np
import torch

from pagedserve.layers.grammar_bitmask import apply_grammar_bitmask


def test_bitmask_matches_a_per_token_reference() -> None:
    generator = np.random.default_rng(0)
    vocab, rows = 1000, 5
    words = (vocab + 31) // 32
    bitmask = generator.integers(-(2**31), 2**31 - 1, size=(2, words), dtype=np.int64).astype(np.int32)
    logits = torch.randn(rows, vocab)
    expected = logits.clone()
    row_ids = [f"r{i}" for i in range(rows)]
    constrained = {"r3": 0, "r1": 1}  # request -> bitmask row; the others are left alone
    for request_id, source in constrained.items():
        row = row_ids.index(request_id)
        for token in range(vocab):
            if not (int(bitmask[source, token // 32]) >> (token % 32)) & 1:
                expected[row, token] = float("-inf")
    apply_grammar_bitmask(logits, row_ids, list(constrained), bitmask)
    assert torch.equal(logits, expected)


def test_requests_with_drafts_get_one_row_per_position() -> None:
    """A request's k-th bitmask row masks its k-th logits row (its verified positions, in order)."""
    vocab = 64
    bitmask = np.zeros((3, 2), dtype=np.int32)
    for source, token in enumerate([5, 6, 7]):  # row j allows only token 5 + j
        bitmask[source, token // 32] = 1 << (token % 32)
    logits = torch.zeros(4, vocab)
    apply_grammar_bitmask(logits, ["plain", "spec", "spec", "spec"], ["spec"] * 3, bitmask)
    assert torch.equal(logits[0], torch.zeros(vocab))
    for row, token in zip((1, 2, 3), (5, 6, 7)):
        assert (logits[row] == 0).nonzero().flatten().tolist() == [token]


def test_matcher_masks_each_draft_position_and_rolls_back() -> None:
    """fill_bitmask with drafts: row j is the mask after the first j drafts; after a draft the grammar
    forbids, rows allow everything (verification stops there); the matcher is left where it was."""
    from concurrent.futures import Future

    import llguidance
    import llguidance.numpy
    from transformers import AutoTokenizer

    from pagedserve.structured_output.grammar import make_ll_tokenizer, to_grammar
    from pagedserve.structured_output.matcher import RequestGrammar
    from pagedserve.structured_outputs_params import StructuredOutputsParams
    from pagedserve.utils.default_model import default_model_path
    from pagedserve.utils.gguf_cache import gguf_hf_folder

    hf_tokenizer = AutoTokenizer.from_pretrained(gguf_hf_folder(default_model_path()))
    tokenizer = make_ll_tokenizer(hf_tokenizer, 49152)
    compiled: Future[llguidance.LLMatcher] = Future()
    compiled.set_result(
        llguidance.LLMatcher(tokenizer, to_grammar(StructuredOutputsParams(regex=r"ab(cd|xy)")))
    )
    grammar = RequestGrammar(compiled)
    a, b, c, x = (hf_tokenizer.convert_tokens_to_ids(t) for t in "abcx")
    bitmask = llguidance.numpy.allocate_token_bitmask(4, 49152)
    grammar.fill_bitmask(bitmask, 0, [], [a, b, c])

    def allowed(row: int) -> set[int]:
        bits = np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")
        return {t for t in (a, b, c, x) if bits[t]}

    assert [allowed(row) for row in range(4)] == [{a}, {b}, {c, x}, set()]
    grammar.fill_bitmask(bitmask, 0, [], [a, c, b])  # c breaks the grammar after "a"
    assert allowed(0) == {a} and allowed(1) == {b}
    assert all(bitmask[row].tolist() == [-1] * bitmask.shape[1] for row in (2, 3))
    grammar.fill_bitmask(bitmask, 0, [a], [])  # rolled back: the matcher follows the output only
    assert allowed(0) == {b}
