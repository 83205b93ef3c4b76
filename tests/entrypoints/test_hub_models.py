"""Hub model ids as vLLM users pass them (`org/name`, `org/name:QUANT` for a GGUF repo, --revision,
--download-dir, a hub id --tokenizer), resolved offline from a Hugging Face cache laid out as
huggingface_hub lays it out (models--org--name/refs/<branch> -> snapshots/<commit>/), built in the test;
online against a Hub served on 127.0.0.1 (fake_hub.py): a GGUF tag's file chosen from the listing."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_hub import FakeHub
from server_utils import API_SERVER, RemoteServer

from pagedserve import LLM, SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.errors import ConfigError
from pagedserve.utils.gguf_cache import gguf_hf_folder
from pagedserve.utils.gguf_tensors import read_gguf
from pagedserve.utils.hub import resolve_model_path

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


# A GGUF repo's files as the Hub lists them: quantization types that hold one another as substrings, a split
# file in a folder, a vision projector (no model).
QUANTS_REPO = [
    "README.md",
    "m-F16.gguf",
    "m-BF16.gguf",
    "m-Q4_0.gguf",
    "m-Q4_0_4_4.gguf",
    "m-IQ4_XS.gguf",
    "m-q4_k_m.gguf",
    "m-Q4_K_XL.gguf",
    "m-UD-Q4_K_XL.gguf",
    "mmproj-F32.gguf",
    "Q8_0/m-Q8_0-00001-of-00002.gguf",
    "Q8_0/m-Q8_0-00002-of-00002.gguf",
]


@pytest.fixture(scope="module")
def quants_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    files = tmp_path_factory.mktemp("quants")
    for name in QUANTS_REPO:
        (files / name).parent.mkdir(exist_ok=True)
        (files / name).write_text(name)
    cache = tmp_path_factory.mktemp("hub")
    add_snapshot(cache, "org/quants", "main", MAIN, files)
    return cache


@pytest.mark.parametrize(
    "tag, chosen",
    [
        ("F16", "m-F16.gguf"),  # not BF16 too
        ("bf16", "m-BF16.gguf"),
        ("Q4_0", "m-Q4_0.gguf"),  # not Q4_0_4_4 too
        ("q4_0_4_4", "m-Q4_0_4_4.gguf"),
        ("IQ4_XS", "m-IQ4_XS.gguf"),
        ("Q4_K_M", "m-q4_k_m.gguf"),
        ("UD-Q4_K_XL", "m-UD-Q4_K_XL.gguf"),
    ],
)
def test_gguf_tag_names_a_whole_quantization_token(quants_cache: Path, tag: str, chosen: str) -> None:
    snapshot = quants_cache / "models--org--quants" / "snapshots" / MAIN
    assert resolve_model_path(f"org/quants:{tag}", download_dir=str(quants_cache)) == str(snapshot / chosen)


@pytest.mark.parametrize(
    "tag, found",
    [
        ("XS", "none does"),  # not IQ4_XS: XS is no whole token of it
        ("Q4", "none does"),
        ("Q4_K_XL", "2 do: m-Q4_K_XL.gguf, m-UD-Q4_K_XL.gguf"),
    ],
)
def test_gguf_tag_naming_no_file_or_several_names_the_candidates(
    quants_cache: Path, tag: str, found: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_model_path(f"org/quants:{tag}", download_dir=str(quants_cache))
    message = str(raised.value)
    assert f"org/quants:{tag} must name one GGUF file of the repo by its quantization, but {found}" in message
    candidates = "Q8_0/m-Q8_0-00001-of-00002.gguf, m-BF16.gguf, m-F16.gguf, m-IQ4_XS.gguf, m-Q4_0.gguf, "
    candidates += "m-Q4_0_4_4.gguf, m-Q4_K_XL.gguf, m-UD-Q4_K_XL.gguf, m-q4_k_m.gguf"
    assert f"(GGUF files: {candidates})" in message and "Q4_0 is not Q4_0_4_4" in message
    with pytest.raises(ConfigError, match=r"org/m:Q4 K: after the colon comes a GGUF quantization type"):
        EngineArgs(model="org/m:Q4 K").create_engine_config()


def test_a_split_gguf_is_refused_before_download_and_as_a_local_part(
    quants_cache: Path, tmp_path: Path
) -> None:
    with pytest.raises(
        ConfigError, match=r"org/quants:Q8_0 names a GGUF split into 2 files .*llama-gguf-split"
    ):
        resolve_model_path("org/quants:Q8_0", download_dir=str(quants_cache))
    import gguf

    part = tmp_path / "m-00001-of-00002.gguf"
    writer = gguf.GGUFWriter(str(part), "llama")
    writer.add_uint16("split.count", 2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"one part of a GGUF split into 2 files.*--merge"):
        read_gguf(str(part))


RESOLVE = """
import sys
from pagedserve.errors import ConfigError
from pagedserve.utils.hub import resolve_model_path
try:
    print(resolve_model_path(sys.argv[1]))
except ConfigError as exc:
    print(exc)
"""


def test_online_the_listing_comes_first_and_only_the_chosen_file_is_downloaded(tmp_path: Path) -> None:
    """huggingface_hub against a Hub on 127.0.0.1: the repo is listed before any download, then only the
    file the tag names is fetched; a tag naming none or several files, or a split GGUF, fetches nothing
    (the old glob fetched every matching file before refusing)."""
    hub = FakeHub("org/quants", {name: name.encode() for name in QUANTS_REPO})
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path)}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", HF_TOKEN="")
    try:
        for tag, downloads, printed in [
            ("F16", ["m-F16.gguf"], "m-F16.gguf"),
            ("Q8_0", [], "split into 2 files"),  # refused before its parts are fetched
            ("Q4_K_XL", [], "but 2 do"),
            ("XS", [], "but none does"),
        ]:
            hub.requests.clear()
            result = subprocess.run(
                [sys.executable, "-c", RESOLVE, f"org/quants:{tag}"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert printed in result.stdout, result.stdout + result.stderr
            assert hub.requests[0] == ("GET", "/api/models/org/quants/tree/main"), hub.requests
            assert sorted(hub.downloads()) == downloads, hub.requests
    finally:
        hub.close()


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
