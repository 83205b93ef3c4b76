"""LLaVA-NeXT against HF transformers on a tiny random config with LlavaNextProcessor's any-res tiles:
greedy tokens equal with one image and with two of other aspect ratios (other grids, other unpadding),
batched with a text prompt, chunked through the images, after recompute preemption and on a prefix hit."""

import pytest
import torch
from test_llava import hf_greedy, random_image  # NOTE: tests/models/, on the path of its tests

from pagedserve import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def hf(tiny_llava_next: str):
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    model = LlavaNextForConditionalGeneration.from_pretrained(tiny_llava_next, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(tiny_llava_next)


def test_any_res_images_batched_chunked_preempted_and_cached_match_hf(tiny_llava_next: str, hf) -> None:
    """A step of 48 tokens cuts every image (40 to 88 tokens) into chunks; 30 blocks of 8 tokens hold two
    of these requests but not all three as they grow, so some are preempted and recomputed."""
    llm = LLM(
        tiny_llava_next,
        dtype="float32",
        max_model_len=160,
        block_size=8,
        max_num_batched_tokens=48,
        max_num_seqs=3,
        num_gpu_blocks_override=30,
        preemption_mode="recompute",
    )
    cases = [
        # a wide image (1 x 2 tiles) and a tall one (2 x 1) with unpadding on other sides, then a 2 x 2 grid
        ("Compare <image> with <image> please", [random_image(1, (64, 30)), random_image(2, (33, 90))]),
        ("A text-only prompt beside the images", []),
        ("USER: <image> What is in the picture? ASSISTANT:", [random_image(0, (50, 45))]),
    ]
    prompts = [{"prompt": text, "multi_modal_data": {"image": images}} for text, images in cases]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    stats = llm.llm_engine.engine_core.get_stats()
    for (text, images), output in zip(cases, outputs):
        prompt_ids, tokens = hf_greedy(hf, text, images, GREEDY.max_tokens)
        assert output.prompt_token_ids == prompt_ids
        assert output.outputs[0].token_ids == tokens, text
    assert stats.num_preemptions_total > 0
    assert stats.num_images_encoded >= 3
    (again,) = llm.generate(prompts[2], GREEDY, use_tqdm=False)
    assert llm.llm_engine.engine_core.get_stats().prefix_cache_hits > stats.prefix_cache_hits
    assert again.outputs[0].token_ids == outputs[2].outputs[0].token_ids
