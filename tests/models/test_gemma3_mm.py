"""Gemma 3 with images against HF transformers (float32) on a tiny random config with Gemma 3's processor:
greedy tokens equal with one and with two images, batched with a text prompt, chunked (never through an
image) and after recompute preemption, on the cpu backend's kernel and on the torch backend (HF's processor
gives the token_type_ids that make an image's tokens attend each other); the same image is a prefix hit (one
ending inside the image), another image is not; the startup refusals name their flags."""

import pytest
import torch
from PIL import Image
from test_llava import hf_greedy, random_image, stats  # NOTE: HF's side is the same through its processor

from pagedserve import LLM, SamplingParams
from pagedserve.errors import ConfigError

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
SHORT = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
BOI = "<start_of_image>"  # where a prompt puts an image (the processor expands it)
# Images at several places: the first one's tokens start past a 24-token step's first chunk would end.
CASES = [
    (f"Please look at this picture very carefully and then tell me{BOI}what it shows", [(0, (40, 50))]),
    (f"A{BOI}and{BOI}compare them", [(1, (64, 32)), (2, (33, 33))]),
    ("A text-only prompt beside the images", []),
    (f"{BOI} again, alone at the start", [(3, (48, 48))]),
]


@pytest.fixture(scope="module")
def hf(tiny_gemma3v: str):
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(tiny_gemma3v, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(tiny_gemma3v)


@pytest.fixture(scope="module")
def llm(tiny_gemma3v: str) -> LLM:
    """A step budget of 24 tokens chunks every image prompt (16 tokens an image, plus its start and end
    tokens); 20 blocks of 8 tokens (full and window layers) run short as the four requests grow, so some
    are preempted (and recomputed)."""
    budgets = dict(max_num_batched_tokens=24, max_num_seqs=4, num_gpu_blocks_override=20)
    return LLM(
        tiny_gemma3v, dtype="float32", max_model_len=80, block_size=8, preemption_mode="recompute", **budgets
    )


def generate_cases(llm: LLM) -> list:
    prompts = [
        {"prompt": text, "multi_modal_data": {"image": [random_image(*image) for image in images]}}
        for text, images in CASES
    ]
    return llm.generate(prompts, GREEDY, use_tqdm=False)


def assert_cases_match_hf(outputs: list, hf) -> None:
    for (text, images), output in zip(CASES, outputs):
        prompt_ids, tokens = hf_greedy(hf, text, [random_image(*image) for image in images], MAX_TOKENS)
        assert output.prompt_token_ids == prompt_ids  # newlines around the image merged as HF's
        assert output.outputs[0].token_ids == tokens, text


def test_images_batched_chunked_preempted_match_hf(llm: LLM, hf) -> None:
    before = stats(llm)
    outputs = generate_cases(llm)
    after = stats(llm)
    assert_cases_match_hf(outputs, hf)
    assert after.num_preemptions_total > before.num_preemptions_total
    assert after.num_images_encoded - before.num_images_encoded >= 4


@pytest.mark.sampled
def test_torch_backend_matches_hf(tiny_gemma3v: str, hf) -> None:
    """The reference backend's masks (the fixture's engine runs the cpu backend's kernel)."""
    engine = LLM(
        tiny_gemma3v, dtype="float32", max_model_len=80, attention_backend="torch", kv_cache_memory="16MiB"
    )
    assert_cases_match_hf(generate_cases(engine), hf)


def test_prefix_hit_same_image_not_another(llm: LLM, hf) -> None:
    # The image's tokens are positions 2-17: the hit (two blocks of 8) ends inside it, and the step after
    # the hit computes the rest of the image with the prompt's end.
    text = f"{BOI}Hi"
    first, other = random_image(10, (40, 40)), random_image(11, (40, 40))

    def hits(image: Image.Image) -> tuple[int, list[int], list[int]]:
        before = stats(llm).prefix_cache_hits
        (output,) = llm.generate(
            {"prompt": text, "multi_modal_data": {"image": image}}, SHORT, use_tqdm=False
        )
        return stats(llm).prefix_cache_hits - before, output.prompt_token_ids, output.outputs[0].token_ids

    assert hits(first)[0] == 0
    other_hits, prompt_ids, other_tokens = hits(other)
    assert other_hits == 0  # the same tokens with another image: another prefix
    assert prompt_ids.index(hf[1].tokenizer.image_token_id) == 2 and len(prompt_ids) < 24
    assert other_tokens == hf_greedy(hf, text, [other], 4)[1]
    same_hits, _, same_tokens = hits(other)
    assert same_hits > 0 and same_tokens == other_tokens


def test_startup_refusals_name_the_flag(tiny_gemma3v: str) -> None:
    with pytest.raises(ConfigError, match=r"--max-num-batched-tokens \(8\) must be at least one image's 16"):
        LLM(tiny_gemma3v, max_num_batched_tokens=8, max_model_len=80)
    with pytest.raises(ConfigError, match="--attention-backend triton cannot attend an image's tokens"):
        LLM(tiny_gemma3v, attention_backend="triton", max_model_len=80, kv_cache_memory="16MiB")
