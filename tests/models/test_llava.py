"""LLaVA-1.5 against HF transformers on a tiny random config: greedy tokens equal with one and with several
images, batched with a text prompt, with prompts chunked through their images, after recompute
preemption and on prefix hits; the encoder runs once per image; prefix-cache keys include the image."""

import base64
import io
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from pagedserve import LLM, SamplingParams
from pagedserve.errors import InvalidRequestError

MAX_TOKENS = 24  # the requests of the batch grow until the pool runs short
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
SHORT = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def random_image(seed: int, size: tuple[int, int]) -> Image.Image:
    pixels = np.random.RandomState(seed).randint(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def hf(tiny_llava: str):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(tiny_llava, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(tiny_llava)


def hf_greedy(
    hf, prompt: str, images: list[Image.Image], max_tokens: int = MAX_TOKENS
) -> tuple[list[int], list[int]]:
    """(HF's processed prompt ids, its greedy tokens)."""
    model, processor = hf
    inputs = processor(text=prompt, images=images or None, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
    prompt_ids = inputs["input_ids"][0].tolist()
    return prompt_ids, out[0, len(prompt_ids) :].tolist()


@pytest.fixture(scope="module")
def llm(tiny_llava: str) -> LLM:
    """A step budget of 24 tokens cuts every image prompt (16 tokens an image) into chunks, some through
    an image; 12 blocks of 8 tokens run short as four of these requests grow by 24 tokens each, so some
    are preempted (and recomputed)."""
    return LLM(
        tiny_llava,
        dtype="float32",
        max_model_len=80,
        block_size=8,
        max_num_batched_tokens=24,
        max_num_seqs=4,
        num_gpu_blocks_override=12,
        preemption_mode="recompute",
    )


def stats(llm: LLM):
    return llm.llm_engine.engine_core.get_stats()


def test_images_batched_chunked_preempted_match_hf(llm: LLM, hf) -> None:
    cases = [
        ("USER: <image> What is in the picture? ASSISTANT:", [random_image(0, (40, 50))]),
        ("Compare <image> with <image> please", [random_image(1, (64, 32)), random_image(2, (33, 33))]),
        ("A text-only prompt beside the images", []),
        ("<image> again, alone at the start", [random_image(3, (48, 48))]),
    ]
    before = stats(llm)
    prompts = [{"prompt": text, "multi_modal_data": {"image": images}} for text, images in cases]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    after = stats(llm)
    for (text, images), output in zip(cases, outputs):
        prompt_ids, tokens = hf_greedy(hf, text, images)
        assert output.prompt_token_ids == prompt_ids
        assert output.outputs[0].token_ids == tokens, text
    assert after.num_preemptions_total > before.num_preemptions_total  # the pool holds two at once
    # NOTE: chunks cut through images and preempted requests resumed: still one encoder run per image
    # (recomputed ones may encode again only once the cache dropped them; 4 images fit its budget).
    assert after.num_images_encoded - before.num_images_encoded == 4
    assert after.encoder_seconds > before.encoder_seconds


def test_prefix_cache_keys_include_the_image(llm: LLM, hf) -> None:
    text = "<image> describe this picture in a few words, as precisely as you can please:"
    first, other = random_image(10, (40, 40)), random_image(11, (40, 40))

    def hits(image: Image.Image) -> tuple[int, list[int]]:
        before = stats(llm).prefix_cache_hits
        (output,) = llm.generate(
            {"prompt": text, "multi_modal_data": {"image": image}}, SHORT, use_tqdm=False
        )
        return stats(llm).prefix_cache_hits - before, output.outputs[0].token_ids

    assert hits(first)[0] == 0
    other_hits, other_tokens = hits(other)
    assert other_hits == 0  # the same tokens with another image: another prefix
    assert other_tokens == hf_greedy(hf, text, [other], 4)[1]
    same_hits, same_tokens = hits(other)
    assert same_hits > 0 and same_tokens == other_tokens


def test_samples_and_chat_share_one_encoder_run(llm: LLM, hf) -> None:
    image = random_image(20, (36, 30))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    before = stats(llm).num_images_encoded
    conversation = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Hi"}],
        }
    ]
    (chat,) = llm.chat(conversation, replace(SHORT, n=2), use_tqdm=False)
    assert stats(llm).num_images_encoded - before == 1
    rendered = hf[1].apply_chat_template(
        [{"role": "user", "content": "<image>\nHi"}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids, tokens = hf_greedy(hf, rendered, [image], 4)
    assert chat.prompt_token_ids == prompt_ids
    assert [sample.token_ids for sample in chat.outputs] == [tokens, tokens]


def test_placeholders_and_images_must_match(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="1 image placeholders .* but 0 images"):
        llm.generate("<image> with no image", SHORT, use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="0 image placeholders .* but 1 images"):
        llm.generate(
            {"prompt": "no placeholder", "multi_modal_data": {"image": random_image(0, (8, 8))}}, SHORT
        )
