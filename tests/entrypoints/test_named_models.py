"""--model NAME=PATH (repeatable, with or without --models-dir): names checked, duplicates refused naming
the flag, and the pool's memory budget counting what a loaded model holds (weights, KV cache, swap). The
running server with two models named this way: test_model_pool_server.py."""

import asyncio
import json
import shutil

import pytest

from pagedserve.config import EngineArgs
from pagedserve.entrypoints.openai.model_pool import LoadedModel, LoadWaits, ModelPool
from pagedserve.entrypoints.openai.models_dir import ModelFile, named_models, served_models
from pagedserve.entrypoints.openai.pool_server import resident_bytes_beside_weights
from pagedserve.entrypoints.openai.residency import ResidencyLimits
from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.sizing import CPU_DEFAULT_KV_BYTES

GIB = 2**30


@pytest.fixture
def folder(tmp_path) -> str:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "x.gguf").write_bytes(b"\0" * 10)
    return str(tmp_path)


def test_named_models_by_name(folder: str):
    models = named_models([f"small={folder}/m", f"org/tiny:q4={folder}/x.gguf"])
    assert {name: (m.path, m.size_bytes) for name, m in models.items()} == {
        "small": (f"{folder}/m", 1000),
        "org/tiny:q4": (f"{folder}/x.gguf", 10),
    }


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "1 to 128"),
        ("a" * 129, "1 to 128"),
        (" a", "surrounding spaces"),
        ("a\nb", "printable"),
        ("a\x00", "printable"),
        ("/abs", "must not start with '/'"),
        ("..", "'..' part"),
        ("a/../b", "'..' part"),
    ],
)
def test_bad_names_are_refused_naming_the_flag(folder: str, name: str, why: str):
    with pytest.raises(ConfigError, match="--model") as error:
        named_models([f"{name}={folder}/m"])
    assert why in str(error.value)


def test_duplicates_and_non_models_are_refused(folder: str, tmp_path_factory):
    with pytest.raises(ConfigError, match="'m' is given twice"):
        named_models([f"m={folder}/m", f"m={folder}/x.gguf"])
    with pytest.raises(ConfigError, match="neither a GGUF file"):
        named_models([f"nothing={folder}/missing"])
    models_dir = tmp_path_factory.mktemp("dir")
    shutil.copytree(f"{folder}/m", models_dir / "m")
    with pytest.raises(ConfigError, match=r"--models-dir .* already serves a model named 'm'"):
        served_models(str(models_dir), [f"m={folder}/x.gguf"])
    both = served_models(str(models_dir), [f"other={folder}/x.gguf"])
    assert list(both) == ["m", "other"]


def test_the_budget_counts_the_kv_cache_and_swap_of_each_model():
    explicit = EngineArgs(kv_cache_memory="2MiB", swap_space=1.0, tensor_parallel_size=2)
    assert resident_bytes_beside_weights(explicit) == 2 * 2**20 + 2 * GIB
    assert resident_bytes_beside_weights(EngineArgs()) == CPU_DEFAULT_KV_BYTES + 4 * GIB

    async def refused() -> str:
        async def never(model: ModelFile) -> LoadedModel:
            raise AssertionError("a model over the budget is never loaded")

        models = {"m": ModelFile("m", "/m", GIB, 0.0)}  # 1 GiB of weights, 2 GiB more for its KV cache
        pool = ModelPool(models, ResidencyLimits(0, 2 * GIB), 60.0, never, LoadWaits(0, None), 2 * GIB)
        try:
            async with pool.use("m"):
                raise AssertionError("admitted")
        except InvalidRequestError as error:
            return f"{error.status_code} {error}"
        finally:
            pool.shutdown()

    message = asyncio.run(refused())
    assert message.startswith("507") and "3.00 GiB" in message and "--max-loaded-memory" in message
