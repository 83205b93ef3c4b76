"""Qwen2.5-VL against HF transformers on a tiny random config: M-RoPE positions equal HF's get_rope_index;
greedy tokens equal with one and with two images of different sizes (one spanning two attention windows),
batched with a text prompt, with prompts chunked through their images, after recompute preemption and on
a prefix hit (whose positions must be the full prompt's); a draft model is refused."""

import numpy as np
import pytest
import torch
from qwen2_5_vl_hf import FRAMED, hf_greedy, hf_inputs, load_hf, noise

from pagedserve import LLM, SamplingParams
from pagedserve.errors import ConfigError
from pagedserve.protocol import ImageInput
from pagedserve.worker.mrope_positions import image_prompt_positions

MAX_TOKENS = 12  # the requests of the batch grow until the pool runs short
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def hf(tiny_qwen2_5_vl: str):
    return load_hf(tiny_qwen2_5_vl)


@pytest.fixture(scope="module")
def llm(tiny_qwen2_5_vl: str) -> LLM:
    """A step budget of 16 tokens cuts the image prompts (4 to 24 tokens an image) into chunks, some
    through an image; 8 blocks of 8 tokens run short as four of these requests grow, so some are
    preempted (and recomputed)."""
    return LLM(
        tiny_qwen2_5_vl,
        dtype="float32",
        max_model_len=64,
        block_size=8,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        num_gpu_blocks_override=9,
        preemption_mode="recompute",
    )


def stats(llm: LLM):
    return llm.llm_engine.engine_core.get_stats()


def test_positions_equal_hf_rope_index(hf) -> None:
    prompt = f"a {FRAMED} then a wider one {FRAMED} and text after"
    inputs = hf_inputs(hf, prompt, [noise(0, 90, 50), noise(1, 200, 60)])
    with torch.no_grad():
        expected, delta = hf[0].model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"]
        )
    ids = inputs["input_ids"][0].tolist()
    pad = hf[0].config.image_token_id
    offsets = [i for i, token in enumerate(ids) if token == pad and ids[i - 1] != pad]
    grids = inputs["image_grid_thw"].tolist()
    images = [
        ImageInput("", offset, t * h * w // 4, [1, t, h, w, 1], b"")
        for offset, (t, h, w) in zip(offsets, grids)
    ]
    table, ours = image_prompt_positions(images, merge=2)
    after = np.arange(table.shape[1], len(ids)) + ours
    assert ours == int(delta) != 0
    assert (
        np.concatenate([table, np.broadcast_to(after, (3, len(after)))], axis=1).tolist()
        == expected[:, 0].tolist()
    )


def test_images_batched_chunked_preempted_match_hf(llm: LLM, hf) -> None:
    cases = [
        (f"{FRAMED} what is in it?", [noise(0, 90, 50)]),
        (f"Two: {FRAMED} and {FRAMED} now", [noise(1, 200, 60), noise(2, 40, 40)]),  # 2 windows; 4 tokens
        ("A text-only prompt beside the images", []),
        (f"At the end {FRAMED}", [noise(3, 60, 120)]),
    ]
    before = stats(llm)
    prompts = [{"prompt": text, "multi_modal_data": {"image": images}} for text, images in cases]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    after = stats(llm)
    expected = [hf_greedy(hf, text, images, MAX_TOKENS) for text, images in cases]
    for (text, _), output, (prompt_ids, tokens) in zip(cases, outputs, expected):
        assert output.prompt_token_ids == prompt_ids
        assert output.outputs[0].token_ids == tokens, text
    assert after.num_preemptions_total > before.num_preemptions_total
    # NOTE: chunks cut through images and preempted requests resumed: still one encoder run per image.
    assert after.num_images_encoded - before.num_images_encoded == 4
    # Again alone: a prefix hit through the first image; the rest computed at the full prompt's positions.
    (again,) = llm.generate(prompts[1], GREEDY, use_tqdm=False)
    assert stats(llm).prefix_cache_hits > after.prefix_cache_hits
    assert again.outputs[0].token_ids == expected[1][1]


def test_a_draft_model_is_refused(tiny_qwen2_5_vl: str) -> None:
    with pytest.raises(ConfigError, match="M-RoPE.*ngram"):
        LLM(tiny_qwen2_5_vl, speculative_config={"model": tiny_qwen2_5_vl, "num_speculative_tokens": 2})
