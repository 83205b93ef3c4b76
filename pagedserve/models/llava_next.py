"""LLaVA-NeXT (LlavaNextForConditionalGeneration): LLaVA-1.5's CLIP tower and projector run on any-res
tiles. The processor resizes an image to the grid pinpoint that fits it best (`image_grid_pinpoints`) and
cuts it into tiles of the tower's size, after one base tile of the whole image; the tiles' patch features
are laid back out as one grid, the padding the resize added is cut off (unpadding) and a learned
`image_newline` embedding ends each row of the grid."""

from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.errors import ConfigError
from pagedserve.models.llava import LlavaForConditionalGeneration

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__(config)
        if config.vision_feature_select_strategy != "default":
            # NOTE: the grid of a tile's features needs exactly its patches (no class token).
            raise ConfigError(
                f"vision_feature_select_strategy={config.vision_feature_select_strategy!r} (config.json): "
                "LLaVA-NeXT's tiles are laid out from their patches alone; only 'default' is supported."
            )
        self.image_newline = nn.Parameter(torch.empty(config.text_config.hidden_size))

    def embed_sized_images(self, pixel_values: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """pixel_values [images, tiles, C, H, W] of images all `image_size` (height, width) before the
        processor -> [images, tokens per image, hidden]: the base tile's features, then the grid's rows
        each ended by `image_newline`."""
        images, tiles = pixel_values.shape[:2]
        features = self.embed_images(pixel_values.flatten(0, 1))  # [images * tiles, patches, hidden]
        features = features.reshape(images, tiles, *features.shape[1:])
        grid = self._grid_features(features[:, 1:], image_size)
        return torch.cat([features[:, 0], grid], dim=1)

    def largest_image(self) -> tuple[list[int], tuple[int, int] | None] | None:
        """An image of exactly the pinpoint size with the most tokens: the most tiles, nothing unpadded."""
        vision = self.config.vision_config
        side = vision.image_size // vision.patch_size

        def tokens(pinpoint: list[int]) -> int:
            rows, columns = pinpoint[0] // vision.image_size, pinpoint[1] // vision.image_size
            return int(rows * side * (columns * side + 1))

        height, width = max(self.config.image_grid_pinpoints, key=tokens)
        tiles = 1 + (height // vision.image_size) * (width // vision.image_size)
        return [1, tiles, vision.num_channels, vision.image_size, vision.image_size], (height, width)

    def _grid_features(self, tiles: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """[images, rows * columns tiles, patches, hidden] -> [images, grid tokens, hidden], row-major
        over the unpadded patch grid with a newline after each row."""
        vision = self.config.vision_config
        rows, columns = grid_shape(image_size, self.config.image_grid_pinpoints, vision.image_size)
        side = vision.image_size // vision.patch_size  # patches along a tile's edge
        if tiles.shape[1] != rows * columns:
            raise ValueError(
                f"an image of size {image_size} came in {tiles.shape[1]} grid tiles, but "
                f"image_grid_pinpoints (config.json) give {rows} x {columns}: the processor's "
                "preprocessor_config.json and the model's config disagree."
            )
        images, hidden = tiles.shape[0], tiles.shape[-1]
        # [images, rows, columns, side, side, hidden] -> [images, rows * side, columns * side, hidden]
        grid = tiles.reshape(images, rows, columns, side, side, hidden).permute(0, 1, 3, 2, 4, 5)
        grid = grid.reshape(images, rows * side, columns * side, hidden)
        top, bottom, left, right = unpadded_box(image_size, grid.shape[1], grid.shape[2])
        grid = grid[:, top:bottom, left:right]
        newline = self.image_newline.to(grid.dtype).expand(images, grid.shape[1], 1, hidden)
        return torch.cat([grid, newline], dim=2).flatten(1, 2)


def grid_shape(image_size: tuple[int, int], pinpoints: list[list[int]], tile_size: int) -> tuple[int, int]:
    """(rows, columns) of tiles the processor cut an image of `image_size` (height, width) into: the
    pinpoint it chose (transformers' own choice, so the two never disagree) over the tile size."""
    from transformers.image_processing_utils import select_best_resolution

    height, width = select_best_resolution(image_size, pinpoints)
    return height // tile_size, width // tile_size


def unpadded_box(image_size: tuple[int, int], height: int, width: int) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of the image inside a `height` x `width` grid it was resized into with
    its aspect ratio kept and padded evenly on the short side (the processor's letterboxing)."""
    original_height, original_width = image_size
    if original_width * height > original_height * width:  # wider than the grid: padded above and below
        # NOTE: rounded at 7 digits as transformers does, so a float's last bit never moves a patch row.
        inner = int(round(original_height * (width / original_width), 7))
        pad = (height - inner) // 2
        return pad, height - pad, 0, width
    inner = int(round(original_width * (height / original_height), 7))
    pad = (width - inner) // 2
    return 0, height, pad, width - pad
