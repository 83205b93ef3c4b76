"""`pagedserve plan --image-tokens` on the tiny LLaVA: image tokens count in each request's KV need and
the encoder cache (--max-num-batched-tokens x hidden_size x dtype bytes, plan_images.py) comes out of a
GPU's KV budget, exactly as the formula docs/features.md states."""

import math

import pytest
from test_plan import plan  # NOTE: tests/entrypoints/, on the path of its tests

from pagedserve.entrypoints.cli import main as cli_main

GiB = 2**30
WORKLOAD = ("--input-tokens", "20", "--output-tokens", "10", "--max-num-batched-tokens", "256")


def test_image_tokens_and_encoder_cache_in_the_plan(
    tiny_llava: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = (*WORKLOAD, "--gpu-memory", "2GiB", "--dtype", "float32", "--max-model-len", "256")
    _, text = plan(capsys, tiny_llava, *gpu)
    _, images = plan(capsys, tiny_llava, *gpu, "--image-tokens", "176")
    assert (text["request_tokens"], images["request_tokens"]) == (30, 30 + 176)
    cache = 256 * 64 * 4  # the budget's tokens x the language model's hidden_size x float32
    assert text["encoder_cache_bytes"] == images["encoder_cache_bytes"] == cache
    left = int(2 * GiB * 0.9) - text["weights_bytes"] - text["activation_bytes"] - text["non_torch_bytes"]
    assert text["kv_budget_bytes"] == left - cache
    assert images["max_requests_at_request_tokens"] == images["num_blocks"] // -(-206 // 16)
    _, explicit = plan(capsys, tiny_llava, *WORKLOAD, "--kv-cache-memory", "1MiB", "--image-tokens", "176")
    assert explicit["kv_budget_bytes"] == 2**20  # an explicit budget is the KV cache's alone


@pytest.mark.parametrize("value", ["-1", str(2**31), str(2**64)])
def test_image_tokens_out_of_range_names_the_flag(
    tiny_llava: str, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["plan", tiny_llava, "--kv-cache-memory", "1MiB", "--image-tokens", value])
    assert exit_info.value.code == 2
    assert "--image-tokens" in capsys.readouterr().err


def test_image_tokens_on_a_text_model_names_the_flag(
    tiny_llama: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["plan", tiny_llama, "--kv-cache-memory", "1MiB", "--image-tokens", "16"])
    assert exit_info.value.code == 2
    assert "--image-tokens 16" in capsys.readouterr().err


def test_mmproj_bytes_in_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """--mmproj: the vision tower and projector count with the text GGUF's weights, in the model's dtype."""
    import os

    from pagedserve.utils.gguf_tensors import read_gguf

    data = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "llama_cpp")
    model, mmproj = (
        os.path.join(data, "tiny-gemma3-vision.gguf"),
        os.path.join(data, "tiny-gemma3-vision.mmproj.gguf"),
    )
    flags = (*WORKLOAD, "--kv-cache-memory", "1MiB", "--dtype", "float32", "--max-model-len", "256")
    _, text = plan(capsys, model, *flags)
    _, images = plan(capsys, model, *flags, "--mmproj", mmproj)
    elements = sum(math.prod(tensor.shape) for tensor in read_gguf(mmproj).tensors)
    assert images["weights_bytes"] - text["weights_bytes"] == elements * 4
