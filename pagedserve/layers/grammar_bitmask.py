"""Apply a step's grammar bitmask (structured outputs) to the logits: disallowed tokens get -inf."""
import numpy as np
import torch

_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)


def apply_grammar_bitmask(logits: torch.Tensor, row_request_ids: list[str], request_ids: list[str],
                          bitmask: np.ndarray) -> None:
    """`logits` [R, V] (row i: `row_request_ids[i]`), in place. `bitmask` row j is `request_ids[j]`'s
    (llguidance's layout: token t is bit t % 32 of int32 word t // 32); rows of other requests are left
    alone. One masked_fill over the whole batch."""
    row_of = {request_id: row for row, request_id in enumerate(row_request_ids)}
    full = np.full((logits.shape[0], bitmask.shape[1]), -1, dtype=np.int32)  # -1: every bit set
    for source, request_id in enumerate(request_ids):
        row = row_of.get(request_id)
        if row is not None:
            full[row] = bitmask[source]
    words = torch.from_numpy(full).to(logits.device)
    allowed = ((words[:, :, None] >> _BIT_SHIFTS.to(logits.device)) & 1).bool().flatten(1)  # [R, 32 * W]
    vocab = logits.shape[1]
    assert allowed.shape[1] >= vocab, "the matchers' tokenizer is built with the model's vocab size"
    logits.masked_fill_(~allowed[:, :vocab], float("-inf"))
