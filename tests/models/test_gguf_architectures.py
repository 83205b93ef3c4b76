"""Which GGUF architectures pagedserve reads: an unsupported one is refused with the list, and a Qwen2-MoE
GGUF's config (expert sizes from llama.cpp's metadata keys) is what `pagedserve plan` counts."""

import json
import math

import pytest
from gguf import GGUFWriter

from pagedserve.config import EngineArgs
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.errors import ConfigError
from pagedserve.families import GGUF_ARCHITECTURES
from pagedserve.utils.gguf_tensors import read_gguf


def test_unsupported_gguf_architecture_lists_the_supported(tmp_path) -> None:
    path = str(tmp_path / "gpt2.gguf")
    writer = GGUFWriter(path, "gpt2")  # metadata only: the architecture is checked before anything else
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match="GGUF architecture 'gpt2' .* is not supported") as error:
        EngineArgs(model=path).create_engine_config()
    for arch in ("qwen2moe (Qwen2-MoE)", "qwen3moe (Qwen3-MoE)", "llama (Llama, Mistral, Mixtral"):
        assert arch in str(error.value)
    assert set(GGUF_ARCHITECTURES) <= set(str(error.value).replace(";", "").split())


def test_plan_counts_a_qwen2_moe_gguf(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every expert and the shared expert resident: the plan's parameters are the GGUF file's elements."""
    from conftest import TINY_MODELS, build_tiny_model
    from gguf_writer import write_gguf

    overrides = {**TINY_MODELS["qwen2_moe"], "mlp_only_layers": []}  # llama.cpp: every layer sparse
    folder = build_tiny_model(str(tmp_path / "hf"), "qwen2_moe", **overrides)
    path = write_gguf(folder, "qwen2moe", str(tmp_path / "qwen2moe.gguf"))
    status = cli_main(["plan", path, "--kv-cache-memory", "1MiB", "--max-model-len", "256", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0 and result["architecture"] == "Qwen2MoeForCausalLM"
    assert result["num_parameters"] == sum(math.prod(t.shape) for t in read_gguf(path).tensors)
