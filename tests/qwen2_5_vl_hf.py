"""The HF transformers reference for the tiny Qwen2.5-VL (tests/conftest.py builds it): its inputs as
Qwen2_5_VLProcessor makes them, and its greedy tokens, shared by the model and server tests."""

import numpy as np
import torch
from PIL import Image

# The image placeholder as Qwen's chat template frames it.
FRAMED = "<|vision_start|><|image_pad|><|vision_end|>"


def noise(seed: int, width: int, height: int) -> Image.Image:
    pixels = np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def load_hf(folder: str):
    """(model, image processor, tokenizer), float32."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoImageProcessor.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def hf_inputs(hf, prompt: str, images: list[Image.Image]) -> dict[str, torch.Tensor]:
    """HF's inputs: each <|image_pad|> expanded to its image's t * h * w / 4 tokens (Qwen2_5_VLProcessor's
    rule; that processor needs torchvision), the image processor's patches and grids."""
    model, image_processor, tokenizer = hf
    pad = model.config.image_token_id
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    inputs: dict[str, torch.Tensor] = {}
    if images:
        inputs = dict(image_processor(images=images, return_tensors="pt"))
        counts = iter((inputs["image_grid_thw"].prod(-1) // 4).tolist())
        ids = [token for i in ids for token in ([pad] * next(counts) if i == pad else [i])]
    input_ids = torch.tensor([ids])
    return dict(inputs, input_ids=input_ids, mm_token_type_ids=(input_ids == pad).int())


def hf_greedy(hf, prompt: str, images: list[Image.Image], max_tokens: int) -> tuple[list[int], list[int]]:
    """(HF's expanded prompt ids, its greedy tokens)."""
    inputs = hf_inputs(hf, prompt, images)
    prompt_ids = inputs["input_ids"][0].tolist()
    with torch.no_grad():
        out = hf[0].generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
    return prompt_ids, out[0, len(prompt_ids) :].tolist()
