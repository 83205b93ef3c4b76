"""A token's logits do not depend on what shares its step nor on where its prompt was cut into chunks:
greedy tokens, logprobs and prompt logprobs the same bits alone and together, at every token budget.
On GGUF models (their quantized matmuls are row-independent) through the cpu attention backend, which
attends every token with one order of operations fixed by its position."""

import random

import pytest

from pagedserve import LLM, SamplingParams

# Varied lengths (4-40 tokens) and kinds, so that with --max-num-batched-tokens 32 prompts are cut at many
# places and share chunks with their neighbours; the jazz one changed text from token 26 on in issue 48.
PROMPTS = [
    "The capital of France is",
    "Write a short poem about the history of jazz music in New Orleans and the musicians who made it famous.",
    "def fibonacci(n):",
    "Once upon a time, in a small village, there lived a very curious cat who",
    "<|im_start|>user\nList three colours.<|im_end|>\n<|im_start|>assistant\n",
    "Translate to French: I would like a cup of coffee, please.",
    "1, 2, 3, 5, 8, 13,",
    "The mitochondria is",
    "Explain why the sky is blue in one sentence.",
    "import numpy as np\nx = np.arange(10)\nprint(",
    "Q: What is the boiling point of water at sea level?\nA:",
    "Dear hiring manager, I am writing to apply for the position of",
    "The three laws of thermodynamics are",
    "<|im_start|>user\nWhat is 17 times 23?<|im_end|>\n<|im_start|>assistant\n",
    "In 1969, astronauts",
    "A recipe for pancakes: first,",
    "SELECT name, age FROM users WHERE",
    "The quick brown fox",
    "Photosynthesis converts light energy into chemical energy stored in glucose. The process takes place in",
    "Hello! My name is",
    "The best way to learn a new language is",
    "for (int i = 0; i < n; ++i) {",
    "Summarize: The meeting was moved from Tuesday to Thursday because the projector in the main room broke.",
    "Rain is",
]


def _values(output) -> tuple[list[int], list[dict[int, float]]]:
    """The generated tokens, and every prompt and decode logprob (top ones and the chosen token's)."""
    steps = output.prompt_logprobs[1:] + output.outputs[0].logprobs
    values = [{token: value.logprob for token, value in step.items()} for step in steps]
    return list(output.outputs[0].token_ids), values


def test_smollm2_prompt_alone_equals_it_among_23_others_in_chunks_of_32(
    default_llm: LLM, default_model: str
) -> None:
    """Issue 48's reproduction: each prompt alone (whole prompt in one step, then decodes of one), all 24
    together (whole prompts, decodes of 24), and all 24 under --max-num-batched-tokens 32 (prompts cut
    into chunks beside others' chunks and decodes): the same bits."""
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    # default_llm's settings but the budget
    chunked = LLM(
        default_model,
        dtype="float32",
        kv_cache_memory="256MiB",
        max_model_len=1024,
        max_num_batched_tokens=32,
    )
    in_chunks = chunked.generate(PROMPTS, params, use_tqdm=False)
    together = default_llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, chunked_output, together_output in zip(PROMPTS, in_chunks, together):
        (alone,) = default_llm.generate([prompt], params, use_tqdm=False)
        assert _values(chunked_output) == _values(alone), prompt
        assert _values(together_output) == _values(alone), prompt


@pytest.mark.parametrize(
    "architecture,quant_type,extra",
    [
        ("llama", "Q4_0", {}),
        pytest.param("llama", "Q4_K", {}, marks=pytest.mark.sampled),
        # sliding windows (24) and an attention logits soft cap; llama.cpp's Gemma 2 ties its head
        pytest.param("gemma2", "Q8_0", {"tie_word_embeddings": True}, marks=pytest.mark.sampled),
    ],
)
def test_tiny_gguf_logprobs_are_the_same_bits_at_every_token_budget(
    tmp_path, architecture: str, quant_type: str, extra: dict[str, object]
) -> None:
    """Prompts of 5-70 tokens all at once with budgets of 2048 (whole prompts), 32 and 7 tokens (prompts cut
    into chunks at other places, beside other prompts' chunks and decodes)."""
    from conftest import TINY_MODELS, build_tiny_model
    from gguf_writer import write_gguf

    # weights of a trained model's scale, every matrix in whole K-quant super-blocks
    overrides = {**TINY_MODELS[architecture], **TINY_MODELS["llama-q4_0"], **extra}
    folder = build_tiny_model(str(tmp_path / "hf"), architecture, **overrides)
    path = write_gguf(folder, architecture, str(tmp_path / "model.gguf"), quant_type=quant_type)
    rng = random.Random(7)
    prompts = [
        {"prompt_token_ids": [rng.randrange(3, 49152) for _ in range(n)]} for n in (5, 70, 9, 33, 12, 48)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    results = {}
    for budget in (2048, 32, 7):
        llm = LLM(path, block_size=16, kv_cache_memory="16MiB", max_num_batched_tokens=budget)
        results[budget] = [_values(output) for output in llm.generate(prompts, params, use_tqdm=False)]
    assert results[32] == results[2048]
    assert results[7] == results[2048]
