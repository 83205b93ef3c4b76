"""A token's logits do not depend on the batch it is decoded in (issue 48): on CPU a float32 model's linear
layers and LM head, and a GGUF's F16 tensors, multiply through the row-invariant kernel
(kernels/cpu/float_matmul.cpp), so a prompt decoded alone and beside 10 or 17 others (prefilled whole
either way) gives the same tokens and logprobs, bit for bit. oneDNN's F.linear, and the GGUF F16 kernel's
row dot at 8 rows or fewer with a GEMM above, gave other bits at other batch sizes."""

import pytest

from pagedserve import LLM, SamplingParams

# 18 prompts of 4 to 12 tokens (distinct, so the neighbours' values differ).
PROMPTS = [[1 + (37 * i + 11 * j) % 997 for j in range(4 + i % 9)] for i in range(18)]
GREEDY_WITH_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=4, logprobs=20)
PROBES = (0, 9)  # the first of every batch, and one in the middle of both


def decode(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], object]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY_WITH_LOGPROBS, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


def assert_decoded_alike_in_every_batch(llm: LLM) -> None:
    alone = {i: decode(llm, [PROMPTS[i]])[0] for i in PROBES}
    for size in (11, 18):
        batched = decode(llm, PROMPTS[:size])
        for i in PROBES:
            assert batched[i] == alone[i], f"prompt {i} in a batch of {size}"


@pytest.mark.sampled
@pytest.mark.parametrize("model", ["llama", "llama-tied-mha"])  # its own LM head; the embedding as head
def test_float32_model_decodes_alike_in_every_batch(tiny_model_factory, model: str) -> None:
    llm = LLM(tiny_model_factory(model), dtype="float32", kv_cache_memory="8MiB")
    assert_decoded_alike_in_every_batch(llm)


def test_gguf_f16_tensors_decode_alike_in_every_batch(tmp_path) -> None:
    """Every matrix of the file in F16 (the output head included), as llama.cpp's converter writes a model
    it is told to keep in half precision."""
    from conftest import build_tiny_model
    from gguf_writer import write_gguf

    folder = build_tiny_model(str(tmp_path / "hf"), "llama")
    path = write_gguf(folder, "llama", str(tmp_path / "model-f16.gguf"), "F16")
    llm = LLM(path, dtype="float32", kv_cache_memory="8MiB")
    assert_decoded_alike_in_every_batch(llm)
