"""Hub model ids as vLLM users pass them (`org/name`, `org/name:QUANT` for a GGUF repo, --revision,
--download-dir, a hub id --tokenizer), resolved offline from a Hugging Face cache laid out as
huggingface_hub lays it out (models--org--name/refs/<branch> -> snapshots/<commit>/), built in the test."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub.utils import filter_repo_objects
from server_utils import API_SERVER, RemoteServer

from pagedserve import LLM, SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.errors import ConfigError
from pagedserve.utils.gguf_cache import gguf_hf_folder
from pagedserve.utils.hub import _gguf_pattern

MAIN, V2 = "a" * 40, "b" * 40


def add_snapshot(cache: Path, repo: str, branch: str, commit: str, files: Path) -> Path:
    """A snapshot of `files` under `commit`, with refs/<branch> pointing at it."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / branch).write_text(commit)
    snapshot = root / "snapshots" / commit
    if files.is_dir():
        shutil.copytree(files, snapshot)
    else:
        snapshot.mkdir(parents=True)
        os.symlink(files, snapshot / files.name)
    return snapshot


@pytest.fixture(scope="module")
def hub_cache(tiny_llama: str, default_model: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("hub")
    add_snapshot(cache, "org/tiny", "main", MAIN, Path(tiny_llama))
    v2 = add_snapshot(cache, "org/tiny", "v2", V2, Path(tiny_llama))
    config = json.loads((v2 / "config.json").read_text())
    (v2 / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 128}))
    add_snapshot(cache, "org/smol-gguf", "main", MAIN, Path(default_model))
    return cache


def test_hub_id_resolves_from_the_cache(hub_cache: Path, tiny_llama: str) -> None:
    config = EngineArgs(model="org/tiny", download_dir=str(hub_cache)).create_engine_config()
    assert config.model.model == str(hub_cache / "models--org--tiny" / "snapshots" / MAIN)
    assert config.model.served_model_name == "org/tiny"  # as the user named it, like vLLM
    v2 = EngineArgs(model="org/tiny", revision="v2", download_dir=str(hub_cache)).create_engine_config()
    assert v2.model.max_model_len == 128 and v2.model.model.endswith(V2)
    tokenizer = EngineArgs(
        model=tiny_llama, tokenizer="org/tiny", tokenizer_revision="v2", download_dir=str(hub_cache)
    ).create_engine_config()
    assert tokenizer.model.tokenizer is not None and tokenizer.model.tokenizer.endswith(V2)


def test_llm_from_a_hub_id_equals_the_folder(hub_cache: Path, tiny_llama: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    expected = LLM(tiny_llama, kv_cache_memory="4MiB").generate("hello hub", params, use_tqdm=False)
    llm = LLM("org/tiny", download_dir=str(hub_cache), revision="main", kv_cache_memory="4MiB")
    actual = llm.generate("hello hub", params, use_tqdm=False)
    assert actual[0].outputs[0].token_ids == expected[0].outputs[0].token_ids


def test_gguf_file_picked_by_its_quantization(hub_cache: Path, default_model: str) -> None:
    config = EngineArgs(model="org/smol-gguf:q4_1", download_dir=str(hub_cache)).create_engine_config()
    assert config.model.gguf_file is not None
    assert os.path.basename(config.model.gguf_file) == os.path.basename(default_model)
    with pytest.raises(ConfigError, match=r"org/smol-gguf:Q8_0 must name one GGUF file .* none does"):
        EngineArgs(model="org/smol-gguf:Q8_0", download_dir=str(hub_cache)).create_engine_config()


@pytest.mark.parametrize(
    "model, revision, words",
    [
        ("org/missing", None, "not in the Hugging Face cache"),
        ("org/tiny", "v3", "revision v3"),
    ],
)
def test_missing_offline_names_the_cache(
    hub_cache: Path, model: str, revision: str | None, words: str
) -> None:
    with pytest.raises(ConfigError, match=words) as raised:
        EngineArgs(model=model, revision=revision, download_dir=str(hub_cache)).create_engine_config()
    assert str(hub_cache) in str(raised.value) and "HF_HUB_OFFLINE" in str(raised.value)


def test_gguf_quant_matches_file_names_in_any_case() -> None:
    # What the Hub is asked for: huggingface_hub filters allow_patterns case-sensitively.
    names = ["m-Q4_K_M.gguf", "m-q4_k_m.gguf", "m-Q4_K_S.gguf", "m-Q8_0.gguf", "Q4_K_M.md"]
    assert list(filter_repo_objects(names, allow_patterns=_gguf_pattern("org/m", "q4_K_m", "--model"))) == [
        "m-Q4_K_M.gguf",
        "m-q4_k_m.gguf",
    ]
    with pytest.raises(ConfigError, match=r"org/m:Q4 K: after the colon comes a GGUF quantization type"):
        EngineArgs(model="org/m:Q4 K").create_engine_config()


def test_hf_config_path_and_draft_model_from_the_hub(
    hub_cache: Path, default_model: str, tiny_llama: str, tmp_path: Path
) -> None:
    # The original model's config beside a GGUF file (vLLM's --hf-config-path), here the GGUF's own
    # with a shorter context to tell them apart.
    config_folder = tmp_path / "config"
    shutil.copytree(gguf_hf_folder(default_model), config_folder)
    config = json.loads((config_folder / "config.json").read_text())
    (config_folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 512}))
    add_snapshot(hub_cache, "org/smol", "main", MAIN, config_folder)
    gguf = EngineArgs(model="org/smol-gguf:Q4_1", hf_config_path="org/smol", download_dir=str(hub_cache))
    resolved = gguf.create_engine_config().model
    assert resolved.max_model_len == 512 and resolved.gguf_file is not None
    with pytest.raises(ConfigError, match=r"Cannot load the model config of .* \(--hf-config-path\)"):
        EngineArgs(model=default_model, hf_config_path=str(tmp_path)).create_engine_config()
    draft = {"model": "org/tiny", "num_speculative_tokens": 2}
    spec = EngineArgs(
        model=tiny_llama, speculative_config=json.dumps(draft), download_dir=str(hub_cache)
    ).create_engine_config()
    assert spec.speculative is not None and spec.speculative.draft_model_config is not None
    assert spec.speculative.draft_model_config.model == str(
        hub_cache / "models--org--tiny" / "snapshots" / MAIN
    )


# A client script as written for a vLLM deployment: wait for /health, chat and stream with the openai
# client, then read the autoscaler's and dashboard's Prometheus series by their vLLM names.
VLLM_CLIENT = """
import os, sys, time
import httpx, openai
from prometheus_client.parser import text_string_to_metric_families

base = sys.argv[1]
while httpx.get(base + "/health").status_code != 200:
    time.sleep(0.5)
client = openai.OpenAI(base_url=base + "/v1", api_key=os.environ["VLLM_API_KEY"])
model = client.models.list().data[0].id
reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
stream = client.completions.create(model=model, prompt="hi", max_tokens=3, stream=True, extra_body={"priority": 1})
chunks = list(stream)
series = {
    s.name: s.value
    for family in text_string_to_metric_families(httpx.get(base + "/metrics").text)
    for s in family.samples
    if s.labels.get("model_name") == model
}
print(model, reply.usage.completion_tokens, len(chunks), series["vllm:num_requests_running"],
      series["vllm:e2e_request_latency_seconds_count"], series["vllm:generation_tokens_total"])
"""


def test_a_vllm_deployment_runs_unchanged(hub_cache: Path, tmp_path: Path) -> None:
    """vLLM's server flags and environment (a hub id from HF_HUB_CACHE, offline; VLLM_API_KEY), and a
    client written for vLLM, unchanged."""
    env = {
        "HF_HUB_CACHE": str(hub_cache),
        "HF_HUB_OFFLINE": "1",
        "VLLM_API_KEY": "k",
        "PAGEDSERVE_API_KEY": "",
    }
    flags = "--tensor-parallel-size 1 --max-model-len 256 --max-num-seqs 8 --enable-prefix-caching "
    flags += "--generation-config auto --scheduling-policy priority --disable-log-requests "
    flags += f"--uvicorn-log-level warning --kv-cache-memory-bytes {4 * 2**20}"
    server = RemoteServer(API_SERVER, ["--model", "org/tiny", *flags.split()], api_key="k", env=env)
    try:
        script = tmp_path / "client.py"
        script.write_text(VLLM_CLIENT)
        result = subprocess.run(
            [sys.executable, str(script), server.base_url],
            env={**os.environ, "VLLM_API_KEY": "k"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["org/tiny", "2", "3", "0.0", "2.0", "5.0"]
    finally:
        server.stop()
