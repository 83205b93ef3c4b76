"""fp8 KV scales shipped in a checkpoint: read per layer in each naming vLLM reads (self_attn.k_scale /
v_scale, k_proj/v_proj.output_scale, kv_scale), used with --kv-cache-dtype fp8, overridden by
--calculate-kv-scales, ignored (but loadable) without an fp8 cache; a bad scale is refused by name."""

import os

import pytest
from conftest import build_tiny_model
from safetensors.torch import load_file, save_file

from pagedserve import LLM, SamplingParams
from pagedserve.errors import ConfigError

pytestmark = pytest.mark.slow  # engines on tiny models

# layer index -> the scale tensors that layer ships (name after "model.layers.N.self_attn.", value)
SHIPPED = {
    0: {"k_scale": 0.25, "v_scale": 0.125},
    1: {"kv_scale": 0.5},
    2: {"k_proj.output_scale": 0.0625, "v_proj.output_scale": 2.0},
}
EXPECTED = [(0.25, 0.125), (0.5, 0.5), (0.0625, 2.0)]


def checkpoint_with_scales(folder: str, scales: dict[int, dict[str, float]]) -> str:
    import torch

    build_tiny_model(folder, "llama", num_hidden_layers=3)
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    for layer, entries in scales.items():
        for name, value in entries.items():
            tensors[f"model.layers.{layer}.self_attn.{name}"] = torch.tensor(value)
    save_file(tensors, path, metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def scaled_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return checkpoint_with_scales(str(tmp_path_factory.mktemp("scaled_llama")), SHIPPED)


def layer_scales(llm: LLM) -> list[tuple[float, float] | None]:
    runner = llm.llm_engine.engine_core.executor.worker.model_runner
    quants = [layer.spec.kv_quant for layer in runner.attention_layers]
    return [None if q is None else (q.k_scale, q.v_scale) for q in quants]


def generate(llm: LLM) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(100, 140))}
    return list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)


def engine(model: str, **kwargs: object) -> LLM:
    return LLM(model, kv_cache_memory="8MiB", max_model_len=128, max_num_batched_tokens=16, **kwargs)


def test_shipped_scales_are_used_with_an_fp8_cache(scaled_llama: str) -> None:
    llm = engine(scaled_llama, kv_cache_dtype="fp8")
    assert layer_scales(llm) == EXPECTED
    assert len(generate(llm)) == 8


def test_calculated_scales_override_shipped_ones(scaled_llama: str) -> None:
    llm = engine(scaled_llama, kv_cache_dtype="fp8_e5m2", calculate_kv_scales=True)
    generate(llm)  # the first batch sets the scales
    scales = layer_scales(llm)
    assert all(s is not None and s not in EXPECTED and s != (1.0, 1.0) for s in scales), scales


def test_shipped_scales_load_without_an_fp8_cache(scaled_llama: str) -> None:
    llm = engine(scaled_llama)
    assert layer_scales(llm) == [None, None, None]
    assert len(generate(llm)) == 8


def test_layers_without_both_scales_keep_scale_one(tmp_path: str) -> None:
    folder = checkpoint_with_scales(str(tmp_path), {0: {"k_scale": 0.25}, 2: {"kv_scale": 0.5}})
    assert layer_scales(engine(folder, kv_cache_dtype="fp8")) == [(1.0, 1.0), (1.0, 1.0), (0.5, 0.5)]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_shipped_scale_is_refused_by_name(tmp_path: str, bad: float) -> None:
    folder = checkpoint_with_scales(str(tmp_path), {1: {"v_scale": bad, "k_scale": 1.0}})
    with pytest.raises(ConfigError, match=r"model\.layers\.1\.self_attn\.v_scale is .* finite and > 0"):
        engine(folder, kv_cache_dtype="fp8")
