"""--generation-config (vLLM's): the model's generation_config.json sets the sampling defaults of requests
that leave a field unset, offline and over HTTP; explicit fields win; `vllm` turns it off; a bad value
fails at startup naming the file."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import hf_beam_search
from server_utils import API_SERVER, RemoteServer
from transformers import AutoTokenizer

from pagedserve import LLM, BeamSearchParams, SamplingParams
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


BEAM_PROMPT = [5, 9, 5, 9, 300, 301, 5, 9]  # a repeated prompt: the penalty matters
BEAMS = BeamSearchParams(beam_width=3, max_tokens=6)


def hf_beams(model: str, repetition_penalty: float) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    eos = AutoTokenizer.from_pretrained(model).eos_token_id
    return hf_beam_search(hf, BEAM_PROMPT, BEAMS, eos, repetition_penalty=repetition_penalty)[0]


@pytest.fixture(scope="module")
def penalized_beams(model_with_defaults: str) -> list[list[int]]:
    """HF's beams with the model's repetition_penalty (its other defaults, sampling knobs, HF's beam
    search ignores); they differ from the unpenalized ones."""
    beams = hf_beams(model_with_defaults, GENERATION["repetition_penalty"])
    assert beams != hf_beams(model_with_defaults, 1.0), "the default penalty changes the beams"
    return beams


def test_beams_take_the_default_penalty(model_with_defaults: str, penalized_beams: list) -> None:
    """The model's repetition_penalty applies to LLM.beam_search as to HF's; its top_k, top_p and
    temperature, sampling knobs, neither apply nor fail the search. The penalty was ignored."""
    llm = LLM(model_with_defaults, kv_cache_memory="4MiB")
    (output,) = llm.beam_search({"prompt_token_ids": BEAM_PROMPT}, BEAMS)
    assert [s.tokens[len(BEAM_PROMPT) :] for s in output.sequences] == penalized_beams


def test_bad_flag_values(model_with_defaults: str) -> None:
    with pytest.raises(ConfigError, match="neither auto, vllm nor a folder"):
        LLM(model_with_defaults, generation_config="/no/such/folder")
    with pytest.raises(ConfigError, match="--override-generation-config is not valid JSON"):
        LLM(model_with_defaults, override_generation_config="{temperature")


def test_server_applies_the_defaults(model_with_defaults: str, penalized_beams: list) -> None:
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
        beams = client.completions.create(
            model=model,
            prompt=BEAM_PROMPT,
            max_tokens=BEAMS.max_tokens,
            n=BEAMS.beam_width,
            extra_body={"use_beam_search": True},
        )
        tokenizer = AutoTokenizer.from_pretrained(model_with_defaults)
        expected = [tokenizer.decode(beam, skip_special_tokens=True) for beam in penalized_beams]
        assert [c.text for c in sorted(beams.choices, key=lambda c: c.index)] == expected
    finally:
        server.stop()
