"""--linear-backend: the flag's resolution and refusals, and end to end, per stored format (GGUF types, a
MoE GGUF, GPTQ and AWQ), the triton backend's greedy tokens (on CPU in Triton's interpreter) equal to the
torch backend's and to the same weights dequantized."""

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest
from conftest import TINY_MODELS, build_tiny_model
from gguf_writer import write_gguf
from int4_reference import Scheme, write_checkpoints

from pagedserve import LLM, SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.config.quantization import resolve_linear_backend
from pagedserve.errors import ConfigError
from pagedserve.quantization.resident import resident_weights

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "kernels"))
from interpreted_triton import DEVICE, import_triton_kernels  # noqa: E402

import_triton_kernels()

PROMPTS = [{"prompt_token_ids": [1, 5, 100, 400, 7]}, {"prompt_token_ids": [1, 300, 42, 500, 11, 6]}]
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
ENGINE = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=16, max_num_seqs=2, device=DEVICE.type)
# A vocabulary of 512 (the prompts' ids stay below it): the embedding and LM head, quantized in a GGUF,
# are most of a tiny model's bytes, and the interpreted kernels' (and the test's K-quantizer's) time
# follows the bytes.
VOCAB = 512
INT4_SCHEMES = {  # act-order with asymmetric zeros: the permutation and the group offsets both run
    "gptq": Scheme("gptq", 32, desc_act=True),
    "awq": Scheme("awq", 64),
}


@dataclass(frozen=True)
class Checkpoint:
    model: str  # the quantized model
    reference: dict[str, object]  # the LLM arguments of the same weights dequantized
    args: dict[str, object]  # the LLM arguments it loads with


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(format) -> Checkpoint, written once per format."""
    floats: dict[str, str] = {}
    built: dict[str, Checkpoint] = {}

    def float_model(name: str, **sizes: object) -> str:
        if name not in floats:
            floats[name] = build_tiny_model(
                str(tmp_path_factory.mktemp(name)),
                "mixtral" if name == "moe" else "llama",
                vocab_size=VOCAB,
                **sizes,
            )
        return floats[name]

    def get(fmt: str) -> Checkpoint:
        if fmt not in built:
            built[fmt] = make(fmt)
        return built[fmt]

    def make(fmt: str) -> Checkpoint:
        root = tmp_path_factory.mktemp(fmt)
        if fmt in INT4_SCHEMES:
            quantized, reference = str(root / "quantized"), str(root / "reference")
            write_checkpoints(
                float_model("int4", hidden_size=128, intermediate_size=256),
                INT4_SCHEMES[fmt],
                quantized,
                reference,
            )
            return Checkpoint(quantized, dict(model=reference), {})
        if fmt == "moe":  # the experts fill Q8_0's blocks of 32
            source, quant = float_model("moe", **TINY_MODELS["mixtral"]), "Q8_0"
        else:  # K-quants need rows of 256 values
            source, quant = (
                float_model("dense", hidden_size=256, intermediate_size=256, initializer_range=0.02),
                fmt,
            )
        folder = shutil.copytree(source, str(root / "hf"))  # write_gguf rewrites it with the GGUF's values
        path = write_gguf(folder, "llama", str(root / "model.gguf"), quant)
        # NOTE: the folder's config: the GGUF's tokenizer metadata (the default model's) says 49152 tokens.
        args: dict[str, object] = dict(hf_config_path=folder)
        return Checkpoint(path, dict(model=path, quantization="none", **args), args)

    return get


def greedy(model: str, **kwargs: object) -> list[list[int]]:
    llm = LLM(model, **ENGINE, **kwargs)
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


def check_backends_agree(checkpoint, fmt: str) -> None:
    chosen = checkpoint(fmt)
    expected = greedy(**chosen.reference)
    assert greedy(chosen.model, linear_backend="torch", **chosen.args) == expected
    assert greedy(chosen.model, linear_backend="triton", **chosen.args) == expected


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_K", "gptq"])
def test_triton_and_torch_equal_the_dequantized_weights(checkpoint, fmt: str) -> None:
    check_backends_agree(checkpoint, fmt)


@pytest.mark.sampled
@pytest.mark.parametrize("fmt", ["Q5_K", "Q6_K", "Q8_0", "moe", "awq"])
def test_triton_and_torch_equal_the_dequantized_weights_sampled(checkpoint, fmt: str) -> None:
    check_backends_agree(checkpoint, fmt)


def test_resident_bytes_are_the_stored_blocks(checkpoint) -> None:
    """On triton the layers keep the file's blocks as they are: the resident blocks are the file's tensor
    bytes, the log's formats the file's type, and the engine reports the model's measured total."""
    from gguf import GGUFReader

    chosen = checkpoint("Q4_K")
    llm = LLM(chosen.model, **ENGINE, linear_backend="triton", **chosen.args)
    model = llm.llm_engine.engine_core.executor.worker.model_runner.model
    blocks = sum(p.numel() for name, p in model.named_parameters() if name.endswith(".qweight"))
    matrices = [t for t in GGUFReader(chosen.model).tensors if len(t.shape) == 2]
    assert blocks == sum(int(t.n_bytes) for t in matrices)
    resident = resident_weights(model)
    assert resident.formats["mlp"] == resident.formats["lm head"] == {"Q4_K"}
    assert llm.llm_engine.engine_core.model_weight_bytes == resident.total


def test_the_flag_resolves_per_device() -> None:
    assert resolve_linear_backend("auto", "cpu") == "native"
    assert resolve_linear_backend("auto", "cuda") == "triton"
    assert resolve_linear_backend("torch", "cuda") == "torch"
    with pytest.raises(ConfigError, match="--linear-backend native runs the C\\+\\+ CPU kernels.*cuda"):
        resolve_linear_backend("native", "cuda")
    for bad in ("", "Triton", "cuda", "2**64"):
        with pytest.raises(ConfigError, match="--linear-backend must be one of auto, native, triton, torch"):
            resolve_linear_backend(bad, "cpu")
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    assert (
        EngineArgs.from_cli_args(parser.parse_args(["--linear-backend", "torch"])).linear_backend == "torch"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--linear-backend", "bogus"])


def test_triton_on_cpu_without_the_interpreter_is_refused_naming_the_variable() -> None:
    """A fresh process without TRITON_INTERPRET: the kernels would compile for a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "from pagedserve.quantization.ggml_backend import check_backend; check_backend('triton', 'cpu')"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "ConfigError" in result.stderr and "TRITON_INTERPRET=1" in result.stderr
    assert "--linear-backend native or torch" in result.stderr


def test_a_block_type_without_a_kernel_is_refused_naming_it_and_the_device(checkpoint) -> None:
    chosen = checkpoint("Q5_0")
    with pytest.raises(
        ConfigError, match=f"ggml type Q5_0 has no kernel in --linear-backend triton on {DEVICE.type}"
    ):
        LLM(chosen.model, **ENGINE, linear_backend="triton", **chosen.args)
