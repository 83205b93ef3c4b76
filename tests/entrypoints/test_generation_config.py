"""--generation-config (vLLM's): the model's generation_config.json sets the sampling defaults of requests
that leave a field unset, offline and over HTTP; explicit fields win; `vllm` turns it off; a bad value
fails at startup naming the file."""

import json
import shutil
from pathlib import Path

import pytest
from server_utils import API_SERVER, RemoteServer

from pagedserve import LLM, SamplingParams
from pagedserve.errors import ConfigError

GENERATION = {"temperature": 0.0, "top_k": 7, "top_p": 0.9, "repetition_penalty": 1.1, "max_new_tokens": 3}


@pytest.fixture(scope="module")
def model_with_defaults(tiny_llama: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("generation") / "model"
    shutil.copytree(tiny_llama, folder)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, **GENERATION}))
    return str(folder)


def test_offline_defaults_and_overrides(model_with_defaults: str) -> None:
    llm = LLM(model_with_defaults, kv_cache_memory="4MiB")
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.max_tokens) == (0.0, 7, 0.9, 3)
    assert defaults.repetition_penalty == 1.1
    output = llm.generate("hello there", use_tqdm=False)[0].outputs[0]
    assert len(output.token_ids) == 3 and output.finish_reason == "length"
    explicit = llm.generate("hello there", SamplingParams(max_tokens=5, temperature=0), use_tqdm=False)
    assert len(explicit[0].outputs[0].token_ids) == 5
    del llm
    plain = LLM(model_with_defaults, kv_cache_memory="4MiB", generation_config="vllm")
    assert plain.get_default_sampling_params() == SamplingParams()
    del plain
    overridden = LLM(
        model_with_defaults, kv_cache_memory="4MiB", override_generation_config='{"max_new_tokens": 2}'
    )
    assert overridden.get_default_sampling_params().max_tokens == 2


@pytest.mark.parametrize(
    "generation, words",
    [
        ({"temperature": -1}, "temperature=-1 must be a number"),
        ({"top_p": 2}, "top_p=2 must be a number"),
        ({"top_k": 1.5}, "top_k=1.5 must be an integer"),
        ({"max_new_tokens": 0}, "max_new_tokens=0"),
        ({"temperature": "hot"}, "temperature='hot'"),
    ],
)
def test_bad_values_fail_at_startup_naming_the_file(
    model_with_defaults: str, tmp_path: Path, generation: dict, words: str
) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    with pytest.raises(ConfigError, match=words) as raised:
        LLM(model_with_defaults, kv_cache_memory="4MiB", generation_config=str(tmp_path))
    assert "generation_config.json" in str(raised.value) and "--generation-config vllm" in str(raised.value)


def test_bad_flag_values(model_with_defaults: str) -> None:
    with pytest.raises(ConfigError, match="neither auto, vllm nor a folder"):
        LLM(model_with_defaults, generation_config="/no/such/folder")
    with pytest.raises(ConfigError, match="--override-generation-config is not valid JSON"):
        LLM(model_with_defaults, override_generation_config="{temperature")


def test_server_applies_the_defaults(model_with_defaults: str) -> None:
    server = RemoteServer(API_SERVER, ["--model", model_with_defaults, "--kv-cache-memory", "4MiB"])
    try:
        assert "Default sampling parameters from the model's generation_config" in server.log()
        client = server.client()
        model = client.models.list().data[0].id
        ask = [{"role": "user", "content": "hi"}]
        first = client.chat.completions.create(model=model, messages=ask)
        again = client.chat.completions.create(model=model, messages=ask)
        assert first.usage.completion_tokens == 3 and first.choices[0].finish_reason == "length"
        assert first.choices[0].message.content == again.choices[0].message.content  # greedy by default
        longer = client.chat.completions.create(model=model, messages=ask, max_tokens=5)
        assert longer.usage.completion_tokens == 5
    finally:
        server.stop()
