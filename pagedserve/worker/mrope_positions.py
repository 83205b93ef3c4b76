"""M-RoPE positions (Qwen2-VL's 3-D rotary positions: temporal, height, width) of the tokens a step
computes, for the families with `mrope`. As HF's get_rope_index: a text token's three positions are one
number, one past the previous token's largest; an image's tokens, on its grid of merged units (t, h, w),
are (start + t, start + row, start + column) from the position `start` after the text before it, and the
text after it continues from start + max(h, w). So from the end of a request's last image on (the rest of
its prompt, its outputs, draft tokens), a token at index i is at i + delta (HF's rope_deltas) in all
three rows: only the prompt up to its last image needs a table. Positions are a function of the token's
index alone, so a chunk cut through an image, a prefix-cache hit and a recomputed request get the full
prompt's positions."""

import numpy as np

from pagedserve.protocol import ImageInput


def image_prompt_positions(images: list[ImageInput], merge: int) -> tuple[np.ndarray, int]:
    """The positions [3, end of the last image] of a prompt's tokens up to its last image's end, and
    delta, the shift of every later token. `images` in prompt order, each with its pixel values folded in
    its patch grid [1, t, h, w, values]."""
    parts: list[np.ndarray] = []
    start = end = 0  # the next text position; the index where the previous image ended
    for image in images:
        text = image.offset - end
        parts.append(np.broadcast_to(np.arange(start, start + text), (3, text)))
        start += text
        t, h, w = image.shape[1], image.shape[2] // merge, image.shape[3] // merge
        grid = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij"))
        parts.append(grid.reshape(3, -1) + start)
        start += max(h, w)
        end = image.offset + image.length
    return np.concatenate(parts, axis=1), start - end


class MRopePositions:
    """Per block-table row of the worker's requests: the positions table of its prompt up to its last
    image and its delta (0 and no table for a text-only request, whose positions are its indices)."""

    def __init__(self, spatial_merge_size: int) -> None:
        self.merge = spatial_merge_size
        self.tables: dict[int, np.ndarray] = {}
        self.deltas = np.zeros(64, dtype=np.int64)

    def add(self, row: int, images: list[ImageInput] | None) -> None:
        """The request now in `row` (its previous holder's table dropped)."""
        self.tables.pop(row, None)
        if row >= len(self.deltas):
            self.deltas = np.resize(self.deltas, max(2 * len(self.deltas), row + 1))
        self.deltas[row] = 0
        if images:
            self.tables[row], self.deltas[row] = image_prompt_positions(images, self.merge)

    def positions(self, token_rows: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """[3, T] positions of the step's tokens: token i of row token_rows[i] at index indices[i]."""
        out = np.repeat((indices + self.deltas[token_rows])[None], 3, axis=0)
        for row in np.intersect1d(token_rows, list(self.tables)):
            table = self.tables[int(row)]
            mask = (token_rows == row) & (indices < table.shape[1])
            out[:, mask] = table[:, indices[mask]]
        return out
