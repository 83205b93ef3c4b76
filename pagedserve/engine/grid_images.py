"""Dynamic-resolution images (the families with `mrope`, Qwen2.5-VL): the model's own HF image processor
(its preprocessor_config.json: resize to multiples of patch x merge within min/max pixels, normalisation,
patches in the vision tower's order) gives each image's grid (`image_grid_thw`), and the image takes
t * h * w / merge^2 placeholder tokens, the rule of HF's Qwen2_5_VLProcessor. That processor is not used
itself: its video half needs torchvision, even for images. Called as ImagePromptProcessor calls a HF
processor, on one placeholder and one image."""

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL.Image import Image

# HF's Qwen2_5_VLProcessor's placeholder, expanded to the image's tokens.
IMAGE_TOKEN = "<|image_pad|>"


class GridImageProcessor:
    image_token = IMAGE_TOKEN

    def __init__(self, model_path: str, image_token_id: int) -> None:
        from transformers import AutoImageProcessor

        self.image_processor = AutoImageProcessor.from_pretrained(model_path)
        self.image_token_id = image_token_id

    def __call__(self, text: str, images: list["Image"], **_: object) -> dict[str, np.ndarray]:
        """input_ids [1, tokens] (the placeholder expanded) and pixel_values [1, t, h, w, patch values]:
        the grid rides in the shape, so images of one grid batch in the encoder and the grid enters the
        content hash."""
        assert text == IMAGE_TOKEN and len(images) == 1, "one placeholder and its image"
        out = self.image_processor(images=images, return_tensors="np")
        t, h, w = (int(n) for n in out["image_grid_thw"][0])
        merge = self.image_processor.merge_size
        pixels = np.asarray(out["pixel_values"]).reshape(1, t, h, w, -1)
        return {"input_ids": np.full((1, t * h * w // merge**2), self.image_token_id), "pixel_values": pixels}
