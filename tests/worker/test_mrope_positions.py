"""M-RoPE positions by token index: a step's tokens cut anywhere through a prompt get the whole prompt's
positions, tokens past the last image continue at index + delta, and a row handed to a text-only request
forgets its previous holder's images."""

import numpy as np

from pagedserve.protocol import ImageInput
from pagedserve.worker.mrope_positions import MRopePositions


def image(offset: int, h: int, w: int) -> ImageInput:
    """An image at `offset` of h x w patches (merge 2: h * w / 4 tokens)."""
    return ImageInput("", offset, h * w // 4, [1, 1, h, w, 1], b"")


def test_positions_of_any_cut_are_the_whole_prompts() -> None:
    mrope = MRopePositions(spatial_merge_size=2)
    mrope.add(3, [image(2, 4, 6)])  # text 0-1, a 2 x 3 grid of tokens at 2-7, text from 8
    whole = mrope.positions(np.full(12, 3), np.arange(12))
    expected = [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 8],  # temporal
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 8],  # height
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8],  # width
    ]
    assert whole.tolist() == expected
    for cut in (1, 4, 9):  # chunks cut before, through and after the image
        parts = [
            mrope.positions(np.full(n, 3), np.arange(start, start + n))
            for start, n in ((0, cut), (cut, 12 - cut))
        ]
        assert np.concatenate(parts, axis=1).tolist() == expected
    # Another request beside it, and the row reused by a text-only request: positions are indices again.
    mixed = mrope.positions(np.array([3, 5]), np.array([4, 4]))
    assert mixed[:, 0].tolist() == [2, 2, 4] and mixed[:, 1].tolist() == [4, 4, 4]
    mrope.add(3, None)
    assert mrope.positions(np.full(3, 3), np.arange(3)).tolist() == [[0, 1, 2]] * 3
