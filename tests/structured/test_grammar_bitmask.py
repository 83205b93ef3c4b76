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
