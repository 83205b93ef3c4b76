"""--mmproj: a Gemma 3 or Qwen2.5-VL text GGUF plus its mmproj GGUF, both written by llama.cpp's own
converter from the tiny HF folders kept beside them (benchmarks/make_test_ggufs.py), against HF
transformers on those folders: greedy tokens equal with one image and with two. The refusals name the
flag; the serve flag reaches the engine's model config."""

import argparse
import os
from collections.abc import Callable

import pytest
import torch
from PIL import Image
from qwen2_5_vl_hf import FRAMED, load_hf, noise
from qwen2_5_vl_hf import hf_greedy as qwen_hf_greedy
from test_llava import hf_greedy, random_image

from pagedserve import LLM, SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.entrypoints.openai.cli_args import args_from_namespace, make_arg_parser
from pagedserve.errors import ConfigError

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "llama_cpp")
MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
BOI = "<start_of_image>"


def gguf(name: str) -> str:
    return os.path.join(DATA, name)


def gemma3_reference(folder: str) -> Callable[[str, list[Image.Image]], tuple[list[int], list[int]]]:
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    hf = (model, AutoProcessor.from_pretrained(folder))
    return lambda prompt, images: hf_greedy(hf, prompt, images, MAX_TOKENS)


def qwen_reference(folder: str) -> Callable[[str, list[Image.Image]], tuple[list[int], list[int]]]:
    hf = load_hf(folder)
    return lambda prompt, images: qwen_hf_greedy(hf, prompt, images, MAX_TOKENS)


# family -> (its HF reference, prompts with their images); Qwen's images within both its HF folder's pixel
# bounds and the processor's default ones (an mmproj file keeps none). No digits in the prompts: the
# GGUF's byte-level BPE splits them by GPT-2's rule, Qwen's tokenizer one by one.
FAMILIES = {
    "gemma3-vision": (
        gemma3_reference,
        [
            (f"Please look at this picture and then tell me{BOI}what it shows", [random_image(0, (40, 50))]),
            (f"A{BOI}and{BOI}compare them", [random_image(1, (64, 32)), random_image(2, (33, 33))]),
        ],
    ),
    "qwen2.5-vl": (
        qwen_reference,
        [
            (f"Look at {FRAMED} and say what it shows", [noise(0, 84, 56)]),
            (f"A {FRAMED} then a wider one {FRAMED} compared", [noise(1, 56, 56), noise(2, 112, 56)]),
        ],
    ),
}


@pytest.mark.sampled  # a seeded one of the two families each run (--sample-all: both)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_with_mmproj_matches_hf(family: str) -> None:
    reference, cases = FAMILIES[family]
    llm = LLM(
        gguf(f"tiny-{family}.gguf"),
        mmproj=gguf(f"tiny-{family}.mmproj.gguf"),
        dtype="float32",
        max_model_len=96,
        kv_cache_memory="16MiB",
    )
    outputs = llm.generate(
        [{"prompt": text, "multi_modal_data": {"image": images}} for text, images in cases],
        GREEDY,
        use_tqdm=False,
    )
    greedy = reference(gguf(f"tiny-{family}"))
    for (text, images), output in zip(cases, outputs):
        prompt_ids, tokens = greedy(text, images)
        assert output.prompt_token_ids == prompt_ids, text
        assert output.outputs[0].token_ids == tokens, text
    assert_vision_weights_equal_hf(llm, gguf(f"tiny-{family}"))


def assert_vision_weights_equal_hf(llm: LLM, folder: str) -> None:
    """Every vision tower and projector weight equals the HF checkpoint's under the model's own mapping of
    checkpoint names (the tiny towers sway the greedy tokens little: a misplaced tensor could hide)."""
    from safetensors.torch import load_file

    model = llm.llm_engine.engine_core.executor.worker.model_runner.model
    params = dict(model.named_parameters())
    vision = {name for name in params if not name.startswith("language_model.")}
    checked = set()
    for name, tensor in load_file(os.path.join(folder, "model.safetensors")).items():
        ours = model._our_name(name)
        if ours in vision:  # NOTE: Gemma 3's projection matrix is F16 in the mmproj file
            torch.testing.assert_close(params[ours].detach(), tensor.float(), atol=1e-3, rtol=0, msg=ours)
            checked.add(ours)
    assert checked == vision


@pytest.mark.parametrize(
    "model, mmproj, problem",
    [
        ("tiny-llama.Q8_0.gguf", "tiny-gemma3-vision.mmproj.gguf", "'llama', which takes no images"),
        ("tiny-gemma3-vision.gguf", "absent.mmproj.gguf", "does not exist"),
        ("tiny-gemma3-vision.gguf", "tiny-gemma3-vision", "is not a file"),
        ("tiny-gemma3-vision.gguf", "tiny-gemma3-vision/config.json", "is not a GGUF file"),
        ("tiny-gemma3-vision.gguf", "tiny-gemma3-vision.gguf", "is not an mmproj GGUF"),
        ("tiny-gemma3-vision.gguf", "tiny-qwen2.5-vl.mmproj.gguf", "projector type 'qwen2.5vl_merger'"),
        ("tiny-gemma3-vision", "tiny-gemma3-vision.mmproj.gguf", "not a GGUF file"),
    ],
)
def test_refusals_name_the_flag(model: str, mmproj: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="--mmproj") as refused:
        EngineArgs(model=gguf(model), mmproj=gguf(mmproj)).model_config("cpu")
    assert problem in str(refused.value)


def test_serve_flag_reaches_the_model_config() -> None:
    argv = ["--model", gguf("tiny-qwen2.5-vl.gguf"), "--mmproj", gguf("tiny-qwen2.5-vl.mmproj.gguf")]
    engine_args = args_from_namespace(make_arg_parser(argparse.ArgumentParser()).parse_args(argv))[0]
    model = engine_args.model_config("cpu")
    assert model.mmproj_file == gguf("tiny-qwen2.5-vl.mmproj.gguf")
    assert model.multimodal is not None and model.multimodal.hf_config.model_type == "qwen2_5_vl"
    # the image processor is the model's own transformers class, with the mmproj file's mean
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(model.processor_folder)
    assert type(processor).__name__.startswith("Qwen2VLImageProcessor")
    assert processor.image_mean == pytest.approx([0.48145466, 0.4578275, 0.40821073])


def test_an_empty_mmproj_is_refused_not_ignored() -> None:
    """`--mmproj ""` once read as no flag in one place and as a file in another (the engine then died)."""
    with pytest.raises(ConfigError, match="--mmproj"):
        EngineArgs(model=gguf("tiny-gemma3-vision.gguf"), mmproj="").model_config("cpu")
