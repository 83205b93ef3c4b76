"""Which GGUF architectures pagedserve reads: an unsupported one is refused with the list, and a Qwen2-MoE
GGUF's config (expert sizes from llama.cpp's metadata keys) is what `pagedserve plan` counts; Gemma 3's query
scale, which transformers does not read."""

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


@pytest.mark.parametrize("layers, scalar", [(2, 16), (62, 32)])
def test_gemma3_query_scale_is_the_head_size_but_hidden_per_head_for_the_27b(
    tmp_path, layers: int, scalar: int
) -> None:
    """transformers' GGUF reading leaves Gemma 3's query_pre_attn_scalar at its config class's 256; Google's
    configs (and llama.cpp) have the head size (16 here), but hidden / heads (64 / 2) for the 62-layer 27B."""
    from pagedserve.utils.gguf_config import gguf_hf_config

    writer = GGUFWriter(str(tmp_path / "gemma3.gguf"), "gemma3")  # metadata only: the config is read
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(128)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_key_length(16)
    writer.add_value_length(16)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(24)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_hf_config(str(tmp_path), "gemma3.gguf").query_pre_attn_scalar == scalar
