"""--generation-config (vLLM's): the model's generation_config.json sets the sampling defaults of requests
that leave a field unset, offline and over HTTP; explicit fields win; `vllm` turns it off; a bad value
fails at startup naming the file."""

import json
import shutil
from pathlib import Path

import pytest
from server_utils import API_SERVER, RemoteServer

from pagedserve import LLM, SamplingParams
from pagedserve.config.generation import generation_defaults
from pagedserve.errors import ConfigError, InvalidRequestError

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
        ({"temperature": -1}, "temperature=-1 is invalid: temperature must be non-negative"),
        ({"temperature": float("nan")}, "temperature=nan is invalid"),
        ({"top_p": 0}, r"top_p=0 is invalid: top_p must be in \(0, 1\]"),  # a request's rule, too
        ({"top_k": 1.5}, "top_k=1.5 is invalid: top_k must be an integer"),
        ({"max_new_tokens": 0}, "max_new_tokens=0 is invalid: max_tokens must be at least 1"),
        ({"temperature": "hot"}, "temperature='hot' is invalid"),
    ],
)
def test_bad_values_fail_at_startup_naming_the_file(
    model_with_defaults: str, tmp_path: Path, generation: dict, words: str
) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    with pytest.raises(ConfigError, match=words) as raised:
        LLM(model_with_defaults, kv_cache_memory="4MiB", generation_config=str(tmp_path))
    assert "generation_config.json" in str(raised.value) and "--generation-config vllm" in str(raised.value)


def test_transformers_defaults_in_the_file_are_no_defaults(tmp_path: Path) -> None:
    """As vLLM, which reads the file's difference from transformers' defaults: "top_k": 50 is not kept."""
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": 50, "temperature": 0.7}))
    assert generation_defaults(str(tmp_path), "unused") == {"temperature": 0.7}
    assert generation_defaults(str(tmp_path), "unused", '{"top_k": 50}') == {"temperature": 0.7, "top_k": 50}


def test_the_default_max_tokens_caps_the_rest_of_the_context(
    model_with_defaults: str, tmp_path: Path
) -> None:
    """A model's max_new_tokens beyond the context never fails a request that did not set max_tokens."""
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 1000, "temperature": 0}))
    llm = LLM(model_with_defaults, kv_cache_memory="4MiB", max_model_len=32, generation_config=str(tmp_path))
    assert llm.get_default_sampling_params().max_tokens == 1000
    prompt = list(range(10, 30))
    output = llm.generate({"prompt_token_ids": prompt}, use_tqdm=False)[0].outputs[0]
    assert len(output.token_ids) == 32 - len(prompt) and output.finish_reason == "length"
    with pytest.raises(InvalidRequestError, match="maximum context length is 32"):
        llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1000), use_tqdm=False)


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
