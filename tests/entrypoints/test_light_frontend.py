"""The API server's process imports neither torch nor transformers where it runs no model: importing the
server and its command line, and a pool (--model NAME=PATH) serving its listings and refusals before
any model is loaded. (Serving a model, the frontend still resolves its config and loads its tokenizer with
transformers: docs/serving.md, Light frontend.)"""

import json
import pickle
import subprocess
import sys

import httpx
import psutil
import pytest
from server_utils import API_SERVER, RemoteServer

from pagedserve.utils.hf_tokenizer import tokenizer_source

# A fresh interpreter as the API server: the server imported, its flags read, then for each model its
# settings resolved (in a child process) and its tokenizer loaded, as the server does before serving it.
_AS_THE_SERVER = """
import argparse, dataclasses, json, pickle, sys
from pagedserve.entrypoints import cli
from pagedserve.entrypoints.openai import api_server
from pagedserve.entrypoints.openai.cli_args import args_from_namespace, make_arg_parser
from pagedserve.entrypoints.openai.pool_server import pool_models, resident_bytes_beside_weights
from pagedserve.config.frontend_config import resolve_frontend_config
from pagedserve.engine.tokenizer import load_tokenizer
parser = make_arg_parser(argparse.ArgumentParser())
engine_args, server_args, _, _ = args_from_namespace(parser.parse_args(sys.argv[1:]))
seen = {}
for name, model in sorted(pool_models(server_args).items()):
    resolved = resolve_frontend_config(dataclasses.replace(engine_args, model=model.path))
    tokenizer = load_tokenizer(resolved.config.model, resolved.tokenizer_class)
    ids = tokenizer.encode(TEXT)
    seen[name] = {
        "model": [resolved.config.model.hf_config.model_type, resolved.config.model.max_model_len],
        "tokenizer": [type(tokenizer).__name__, ids, tokenizer.decode(ids)],
        "skipped": tokenizer.decode(ids, skip_special_tokens=True),
        "chat": tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
        "sent to the engine": pickle.dumps(resolved.config).hex(),
    }
heavy = sorted(name for name in sys.modules if name == "torch" or name.startswith("transformers.configuration"))
print(json.dumps({"models": seen, "budget": resident_bytes_beside_weights(engine_args), "heavy": heavy}))
"""
TEXT = "Héllo <b>wörld</b> 🙂<|im_end|>\n  x  "
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXT}]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> str:
    """A HF folder as the pool lists it (its config.json); no test here loads it."""
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return str(folder)


def test_the_server_reads_its_flags_configs_and_tokenizers_without_torch(
    default_model: str, tiny_model_factory
):
    """The settings and tokenizer the server gets are transformers' (resolved here directly, AutoTokenizer),
    its process never imports torch nor transformers' configs, and what it sends the engine process is
    transformers' config again: the default GGUF, and a HF folder whose tokenizer class comes from its
    config.json's model type (Qwen2's)."""
    from transformers import AutoTokenizer, PretrainedConfig

    from pagedserve.config import EngineArgs

    qwen2 = tiny_model_factory("qwen2")
    flags = ["--model", f"smol={default_model}", "--model", f"qwen2={qwen2}", "--kv-cache-memory", "1MiB"]
    code = f"TEXT = {TEXT!r}; MESSAGES = {MESSAGES!r}" + _AS_THE_SERVER
    run = subprocess.run(
        [sys.executable, "-c", code, *flags, "--swap-space", "0"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["heavy"] == [] and seen["budget"] == 2**20
    for name, path in [("smol", default_model), ("qwen2", qwen2)]:
        model = EngineArgs(model=path, kv_cache_memory="1MiB").create_engine_config().model
        engine_side = pickle.loads(
            bytes.fromhex(seen["models"][name].pop("sent to the engine"))
        ).model.hf_config
        assert (
            isinstance(engine_side, PretrainedConfig) and engine_side.to_dict() == model.hf_config.to_dict()
        )
        reference = AutoTokenizer.from_pretrained(
            tokenizer_source(model.model, model.tokenizer, model.gguf_file)
        )
        ids = reference.encode(TEXT)
        assert seen["models"][name] == {
            "model": [model.hf_config.model_type, model.max_model_len],
            "tokenizer": [type(reference).__name__, ids, reference.decode(ids)],
            "skipped": reference.decode(ids, skip_special_tokens=True),
            "chat": reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
        }


def test_the_smol_server_holds_no_torch(smol_server):
    """The real server of the default model (shared with other modules): its API server process has not
    loaded torch (libtorch is not mapped), its engine process has."""
    frontend = psutil.Process(smol_server.proc.pid)
    assert not [m.path for m in frontend.memory_maps() if "libtorch" in m.path]
    engine = psutil.Process(smol_server.engine_pid())
    assert [m.path for m in engine.memory_maps() if "libtorch" in m.path]


def test_a_pool_serves_its_listings_without_torch(model_folder: str):
    server = RemoteServer(API_SERVER, ["--model", f"tiny={model_folder}"])
    try:
        assert [card.id for card in server.client().models.list().data] == ["tiny"]
        tags = httpx.get(f"{server.base_url}/api/tags", timeout=10).json()["models"]
        assert [tag["name"] for tag in tags] == ["tiny"]
        unknown = httpx.post(f"{server.base_url}/v1/completions", json={"model": "../tiny", "prompt": "x"})
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
        mapped = {m.path for m in psutil.Process(server.proc.pid).memory_maps()}
        assert not [path for path in mapped if "libtorch" in path], "the pool's frontend loaded torch"
        assert server.proc.poll() is None
    finally:
        server.stop()
