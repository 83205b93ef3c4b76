"""`pagedserve plan` on fp8 checkpoints: linear layers at 1 byte per weight plus their float32 scales,
equal to the bytes the engine holds once it loaded the same tiny checkpoint (per-tensor, per-channel and
block-wise scales); and Llama-2-7B's figure by hand."""

import json
import os

import pytest

from pagedserve import LLM
from pagedserve.entrypoints.cli import main as cli_main
from tests.quantization.test_fp8_weights import fp8_checkpoint

DATA = os.path.join(os.path.dirname(__file__), os.pardir, "data")


def plan_weights(capsys: pytest.CaptureFixture[str], model: str, *args: str) -> int:
    assert cli_main(["plan", model, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)["weights_bytes"]


@pytest.mark.parametrize("scheme", ["per-tensor", "per-channel", "block"])
def test_plan_weights_are_what_the_engine_holds(
    tmp_path, tiny_llama: str, capsys: pytest.CaptureFixture[str], scheme: str
) -> None:
    fp8_folder, _ = fp8_checkpoint(tiny_llama, str(tmp_path), scheme)
    llm = LLM(fp8_folder, kv_cache_memory="1MiB", max_model_len=256, dtype="float32")
    held = llm.llm_engine.engine_core.executor.worker.weights_bytes
    planned = plan_weights(
        capsys, fp8_folder, "--kv-cache-memory", "1MiB", "--max-model-len", "256", "--dtype", "float32"
    )
    float_weights = plan_weights(
        capsys, tiny_llama, "--kv-cache-memory", "1MiB", "--max-model-len", "256", "--dtype", "float32"
    )
    assert planned == held < float_weights


@pytest.mark.parametrize("block", [None, [128, 128]])
def test_llama_2_7b_fp8(tmp_path, capsys: pytest.CaptureFixture[str], block: list[int] | None) -> None:
    """fp16 embeddings, LM head and norms; 1 byte per linear weight; a float32 scale per output row of
    each linear layer (block-wise: per row and 128 columns)."""
    config = json.load(open(os.path.join(DATA, "llama-2-7b", "config.json")))
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    if block:
        config["quantization_config"]["weight_block_size"] = block
    (tmp_path / "config.json").write_text(json.dumps(config))
    linear = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    others = 2 * 32000 * 4096 + 32 * 2 * 4096 + 4096  # embeddings, LM head, norms
    # rows x scale columns: q, k, v, o, gate, up (4096 columns each) and down (11008)
    columns = (lambda k: 1) if block is None else (lambda k: -(-k // 128))
    scales = 32 * ((4 * 4096 + 2 * 11008) * columns(4096) + 4096 * columns(11008))
    assert (
        plan_weights(capsys, str(tmp_path / "config.json"), "--kv-cache-memory", "8GiB")
        == 2 * others + linear + 4 * scales
    )
