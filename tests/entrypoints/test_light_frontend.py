"""The API server's process imports neither torch nor transformers where it runs no model: importing the
server and its command line, and a pool (--model NAME=PATH) serving its listings and refusals before
any model is loaded. (Serving a model, the frontend still resolves its config and loads its tokenizer with
transformers: docs/serving.md, Light frontend.)"""

import json
import subprocess
import sys

import httpx
import psutil
import pytest
from server_utils import API_SERVER, RemoteServer

# Imported in a fresh interpreter as `pagedserve serve` does, then the serve flags parsed and resolved.
_IMPORT_SERVER = """
import argparse, json, sys
from pagedserve.entrypoints import cli
from pagedserve.entrypoints.openai import api_server
from pagedserve.entrypoints.openai.cli_args import args_from_namespace, make_arg_parser
from pagedserve.entrypoints.openai.pool_server import pool_models, resident_bytes_beside_weights
from pagedserve.config.engine import resolve_device
parser = make_arg_parser(argparse.ArgumentParser())
engine_args, server_args, _, _ = args_from_namespace(parser.parse_args(sys.argv[1:]))
resolve_device(engine_args.device)
print(json.dumps([sorted(pool_models(server_args)), resident_bytes_beside_weights(engine_args),
                  sorted({name.split(".")[0] for name in sys.modules} & {"torch", "transformers"})]))
"""


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> str:
    """A HF folder as the pool lists it (its config.json); no test here loads it."""
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return str(folder)


def test_the_server_imports_and_reads_its_flags_without_torch(model_folder: str):
    flags = ["--model", f"tiny={model_folder}", "--kv-cache-memory", "1MiB", "--swap-space", "0"]
    run = subprocess.run([sys.executable, "-c", _IMPORT_SERVER, *flags], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [["tiny"], 2**20, []]


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
