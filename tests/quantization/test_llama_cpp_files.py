"""GGUF files written by llama.cpp's own converter and quantizer (tests/data/llama_cpp, made by
benchmarks/make_test_ggufs.py): each served through the native and the Triton (on CPU, interpreted) block
kernels gives the greedy tokens of the same weights dequantized; the gpt-oss file (MXFP4 experts, kept
packed) and the DeepSeek V2 and V3 files (MLA) give those of the HF folders they were converted from."""

import functools
import json
import os
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from pagedserve import LLM, SamplingParams
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.errors import ConfigError
from pagedserve.families import gguf_family
from pagedserve.model_loader.gguf_gate_up import GateUpJoiner
from pagedserve.utils.gguf_metadata_config import metadata_config
from pagedserve.utils.gguf_tensors import read_gguf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "kernels"))
from interpreted_triton import DEVICE, import_triton_kernels  # noqa: E402

import_triton_kernels()

DATA = os.path.join(os.path.dirname(__file__), os.pardir, "data", "llama_cpp")
# Ids below both vocabularies (256 SentencePiece pieces, 300 BPE tokens). Short: the interpreted Triton
# kernels take time per tile; gpt-oss's second prompt outgrows its 24-token window.
PROMPTS = [{"prompt_token_ids": [1, 5, 100, 200, 7]}, {"prompt_token_ids": [1, 9, 42, 250, 3, 17]}]
GPT_OSS_PROMPTS = [PROMPTS[0], {"prompt_token_ids": [1, *range(3, 40)]}]
PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)  # a prefill, two decodes
ENGINE = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=32, max_num_seqs=2, device=DEVICE.type)


def path(name: str) -> str:
    return os.path.join(DATA, name)


def greedy(
    model: str, prompts: list[dict] = PROMPTS, params: SamplingParams = PARAMS, **kwargs: object
) -> list[list[int]]:
    llm = LLM(model, **ENGINE, **kwargs)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@functools.cache
def dequantized(name: str) -> list[list[int]]:
    """The file's weights dequantized to float32 (one run per file for both backends)."""
    tokens = greedy(path(name), quantization="none")
    assert len({token for each in tokens for token in each}) > 2  # not a degenerate model
    return tokens


def check_file(name: str, backend: str) -> None:
    if backend == "native":
        assert greedy(path(name), linear_backend=backend) == dequantized(name)
        return
    # NOTE: interpreted Triton takes seconds a step: a prefill and one decode, the reference's first two
    # tokens (greedy tokens do not depend on how many follow)
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    tokens = greedy(path(name), params=params, linear_backend=backend)
    assert tokens == [each[:2] for each in dequantized(name)]


@pytest.mark.parametrize(
    "name,backend", [("tiny-llama.Q4_K_M.gguf", "triton"), ("tiny-mixtral.Q4_K_M.gguf", "native")]
)
def test_llama_cpp_files_give_the_dequantized_tokens(name: str, backend: str) -> None:
    check_file(name, backend)


@pytest.mark.sampled
@pytest.mark.parametrize(
    "name,backend",
    [
        (f"tiny-llama.{quant}.gguf", backend)
        for quant in ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
        for backend in ("native", "triton")
        if (quant, backend) != ("Q4_K_M", "triton")
    ]
    + [("tiny-mixtral.Q4_K_M.gguf", "triton")],
)
def test_llama_cpp_files_give_the_dequantized_tokens_sampled(name: str, backend: str) -> None:
    check_file(name, backend)


@pytest.mark.parametrize("backend", ["native", pytest.param("triton", marks=pytest.mark.sampled)])
def test_gpt_oss_file_keeps_mxfp4_experts_and_gives_the_hf_folders_tokens(backend: str) -> None:
    """The experts as ggml MXFP4 rows on the block kernels of `backend`."""
    llm = LLM(path("tiny-gpt-oss.gguf"), **ENGINE, linear_backend=backend)
    ours = [list(o.outputs[0].token_ids) for o in llm.generate(GPT_OSS_PROMPTS, PARAMS, use_tqdm=False)]
    experts = llm.llm_engine.engine_core.executor.worker.model_runner.model.model.layers[0].mlp.experts
    assert experts.w13_rows.dtype == torch.uint8 and not hasattr(experts, "w13_weight")
    assert ours == greedy(path("tiny-gpt-oss"), GPT_OSS_PROMPTS)


@pytest.mark.sampled
def test_gpt_oss_file_dequantized_gives_the_hf_folders_tokens() -> None:
    expected = greedy(path("tiny-gpt-oss"), GPT_OSS_PROMPTS)
    assert greedy(path("tiny-gpt-oss.gguf"), GPT_OSS_PROMPTS, quantization="none") == expected


@pytest.mark.parametrize("family", [pytest.param("deepseek-v2", marks=pytest.mark.sampled), "deepseek-v3"])
def test_deepseek_files_give_the_hf_folders_tokens(family: str) -> None:
    """V2 (softmax, group-limited) and V3 (sigmoid with its correction bias, YaRN with mscale) told apart
    by the file's gating function; kv_b_proj joined from llama.cpp's k_b and v_b; F32 rows kept as blocks
    and dequantized alike."""
    expected = greedy(path(f"tiny-{family}"), GPT_OSS_PROMPTS)
    assert greedy(path(f"tiny-{family}.gguf"), GPT_OSS_PROMPTS) == expected
    assert greedy(path(f"tiny-{family}.gguf"), GPT_OSS_PROMPTS, quantization="none") == expected


def test_gpt_oss_experts_in_another_type_are_refused_naming_the_tensor() -> None:
    joiner = GateUpJoiner(keep_packed=True)
    rows = np.zeros((4, 64, 34), dtype=np.uint8)
    with pytest.raises(ConfigError, match=r"mlp\.experts\.gate_proj\.weight is Q8_0: .*MXFP4"):
        list(joiner.add("model.layers.0.mlp.experts.gate_proj.weight", GGMLQuantizationType.Q8_0, rows))


def test_plan_counts_the_gpt_oss_files_experts_at_mxfp4s_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    """Experts at 17 bytes per 32 weights (2 layers x gate, up, down x 4 experts of 32 x 64), every other
    tensor of the file in 16 bits (the plan's device dtype)."""
    from gguf import GGUFReader

    gguf = path("tiny-gpt-oss.gguf")
    assert cli_main(["plan", gguf, "--json", "--kv-cache-memory", "1MiB", "--max-model-len", "64"]) == 0
    plan = json.loads(capsys.readouterr().out)
    tensors = GGUFReader(gguf).tensors
    experts = sum(int(t.n_elements) for t in tensors if t.tensor_type == GGMLQuantizationType.MXFP4)
    floats = sum(int(t.n_elements) for t in tensors if t.tensor_type != GGMLQuantizationType.MXFP4)
    assert experts == 2 * 3 * 4 * 32 * 64
    assert plan["weights_bytes"] == experts * 17 // 32 + 2 * floats


def test_gpt_oss_rope_scaling_outside_the_implementation_is_refused_naming_the_key() -> None:
    file = read_gguf(path("tiny-gpt-oss.gguf"))
    file.metadata["gpt-oss.rope.scaling.type"] = "longrope"
    facts = gguf_family("gpt-oss")
    assert facts is not None
    with pytest.raises(ConfigError, match=r"gpt-oss\.rope\.scaling\.type='longrope'"):
        metadata_config(file, facts, "gpt-oss")
