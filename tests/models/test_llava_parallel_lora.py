"""Images with tensor parallelism and with LoRA: the tiny LLaVA at tp=2 (two real worker processes, the
vision tower replicated on both) gives one process's greedy tokens, and an adapter on its language model
gives HF transformers' tokens with the adapter merged, beside a request of the base model in one batch
(an adapter of the vision tower is refused)."""

import pytest
import torch
from lora_adapters import merge_adapter, write_adapter  # NOTE: tests/, on the path of every test
from test_llava import hf_greedy, random_image  # NOTE: tests/models/, on the path of its tests

from pagedserve import LLM, SamplingParams
from pagedserve.lora.request import LoRARequest

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [
    {
        "prompt": "Compare <image> with <image>",
        "multi_modal_data": {"image": [random_image(1, (64, 32))] * 2},
    },
    {
        "prompt": "USER: <image> What is it? ASSISTANT:",
        "multi_modal_data": {"image": [random_image(2, (33, 40))]},
    },
    {"prompt": "A text-only prompt beside the images"},
]
ARGS = dict(dtype="float32", kv_cache_memory="16MiB", max_model_len=128)


def greedy(llm: LLM, **kwargs: object) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False, **kwargs)]


@pytest.mark.sampled
def test_images_at_tp2_equal_one_process(tiny_llava: str) -> None:
    one = LLM(tiny_llava, **ARGS)
    expected = greedy(one)
    one.llm_engine.engine_core.shutdown()
    two = LLM(tiny_llava, tensor_parallel_size=2, **ARGS)
    try:
        assert greedy(two) == expected
    finally:
        two.llm_engine.engine_core.shutdown()


@pytest.mark.sampled
def test_adapter_on_the_language_model_equals_hf_merged(tiny_llava: str, tmp_path) -> None:
    from transformers import AutoConfig, AutoProcessor, LlavaForConditionalGeneration

    text_config = AutoConfig.from_pretrained(tiny_llava).text_config
    # NOTE: PEFT's names for transformers' LLaVA: the decoder's modules under model.language_model.
    adapter = write_adapter(str(tmp_path / "lora"), text_config, 8, 16, decoder="model.language_model.")
    llm = LLM(tiny_llava, enable_lora=True, max_lora_rank=8, **ARGS)
    lora = LoRARequest("llava-lm", 1, adapter)
    outputs = llm.generate(PROMPTS[:2], GREEDY, lora_request=[lora, None], use_tqdm=False)
    model = LlavaForConditionalGeneration.from_pretrained(tiny_llava, dtype=torch.float32).eval()
    hf = (model, AutoProcessor.from_pretrained(tiny_llava))
    base = [hf_greedy(hf, p["prompt"], p["multi_modal_data"]["image"], 8)[1] for p in PROMPTS[:2]]
    merge_adapter(model, adapter)
    merged = hf_greedy(hf, PROMPTS[0]["prompt"], PROMPTS[0]["multi_modal_data"]["image"], 8)[1]
    assert merged != base[0]  # the adapter changes the tokens
    assert [o.outputs[0].token_ids for o in outputs] == [merged, base[1]]
    vision = write_adapter(
        str(tmp_path / "vision"),
        text_config,
        4,
        8,
        ("q_proj",),
        decoder="model.vision_tower.vision_model.encoder.",
    )
    with pytest.raises(ValueError, match="vision_tower.*cannot take a LoRA delta"):
        llm.generate(PROMPTS[2], GREEDY, use_tqdm=False, lora_request=LoRARequest("vision", 2, vision))
