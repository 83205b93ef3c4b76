"""The embedded default model (SmolLM2-135M-Instruct from its GGUF) against HF transformers."""
import os

import pytest
import torch

from pagedserve import LLM, SamplingParams


@pytest.fixture(scope="module")
def smol_llm() -> LLM:
    return LLM(kv_cache_memory="256MiB", max_model_len=1024)


def test_default_model_greedy_matches_hf(smol_llm: LLM, default_model: str) -> None:
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(default_model)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"
               " there lived a very curious cat who"]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = smol_llm.generate(prompts, params, use_tqdm=False)
    for output in outputs:
        ids = torch.tensor([output.prompt_token_ids])
        expected = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert output.outputs[0].token_ids == expected[0, ids.shape[1]:].tolist()
    tokenizer = smol_llm.get_tokenizer()
    assert outputs[0].outputs[0].text == tokenizer.decode(outputs[0].outputs[0].token_ids,
                                                          skip_special_tokens=True)
    assert "Paris" in outputs[0].outputs[0].text


def test_default_model_chat_stops_at_eos(smol_llm: LLM) -> None:
    outputs = smol_llm.chat([{"role": "user", "content": "Say hello."}],
                            SamplingParams(temperature=0.0, max_tokens=64), use_tqdm=False)
    completion = outputs[0].outputs[0]
    assert completion.finish_reason == "stop"
    assert completion.text.strip()
    assert "<|im_end|>" not in completion.text
